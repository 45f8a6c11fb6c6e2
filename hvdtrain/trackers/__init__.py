"""Experiment trackers (``--tracker mlflow``, ``--tracker wandb``): sinks of the run log
(loop/sinks.py) that send its lines to MLflow or Weights & Biases, one tracker run per job.

    sink.py           TrackerSink: the run log's side, a queue and a thread per tracker
    metrics.py        the run log's lines as metric names, parameters and tags
    state.py          tracker.json in the run folder: the tracker run a resume continues
    mlflow_backend.py MLflow (a SQLite store in the run folder unless MLFLOW_TRACKING_URI)
    wandb_backend.py  W&B (offline in the run folder unless the user has logged in)
    parent.py         the parent run of ``hvdtrain compare --tracker mlflow``
    names.py, build.py  --tracker's value, and the sinks it asks for
    replay.py         python -m hvdtrain.trackers.replay: send metrics.jsonl to a tracker later
"""

# name -> (module.class of its backend, the package it needs, what to install)
TRACKERS = {
    "mlflow": ("mlflow_backend.MlflowBackend", "mlflow", "pip install 'hvdtrain[mlflow]'"),
    "wandb": ("wandb_backend.WandbBackend", "wandb", "pip install 'hvdtrain[wandb]'"),
}
