"""The options of the loop: how long, how big, where the results go, evaluation, checkpoints,
logs and trackers, the device, and the study settings (stragglers, injected faults)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, require
from ..stragglers import parse_straggler
from .values import (MAX_SEED, SEED_RANGE, check_faults, check_tracker, check_writable_folder,
                     opt, parse_metric_goal, parse_stop_at)


@dataclass
class RunConfig:
    """The loop: how long, how big, where the results go."""

    mode: str = opt("sync", "update scheme: sync (Horovod allreduce) or async (parameter "
                    "server over MPI; launch with mpirun)", choices=("sync", "async"))
    epochs: int = opt(20, "passes over the training split")
    batch_size: int = opt(32, "samples per worker per optimizer step; the global batch is "
                          "this times the number of workers")
    seed: int = opt(0, "seed of model initialisation and data shuffling")
    max_steps_per_epoch: int = opt(0, "stop each epoch after this many steps (0: no limit); "
                                   "for benchmarks and quick checks")
    eval_every: int = opt(1, "evaluate test accuracy every N epochs (and always at the end)")
    eval_every_steps: int = opt(0, "also evaluate every N steps (of worker 0) inside the epochs "
                                "and log an eval line stamped with the wall time (0: only at "
                                "epoch ends); what compare uses to time the target to a few "
                                "percent. Early stopping and --keep-best still follow the "
                                "epoch evaluations")
    run_dir: str | None = opt(None, "folder for the metrics log and checkpoints "
                              "(default: runs/<time>-<mode>-<dataset>-<model>)")
    checkpoint_every: int = opt(1, "write a checkpoint every N epochs (0: only at the end)")
    checkpoint_steps: int = opt(0, "also write one every N steps inside an epoch, so a crash "
                                "in a long epoch loses at most N steps (0: at epoch ends only)")
    async_checkpoint: bool = opt(False, "write checkpoints in a background thread: a step "
                                 "waits only while the state is copied to CPU memory, then "
                                 "training goes on while the copy is written (atomically, as "
                                 "always). A save waits for the write before it; a stop, "
                                 "best.pt and the end of the run wait for the last one")
    keep_best: str = opt("", "also keep best.pt in the run folder, the checkpoint of the best "
                         "evaluation so far by this metric: test_loss, test_acc or any test_ "
                         "metric the run reports. Names ending in loss are minimised, others "
                         "maximised; a min: or max: prefix says which, e.g. min:test_mae")
    early_stop_patience: int = opt(0, "stop when the --keep-best metric has not improved in N "
                                   "evaluations (0: never); the run then writes its final "
                                   "checkpoint and exits 0")
    stop_at: str = opt("", "stop training once an evaluation (at an epoch's end, or every "
                       "--eval-every-steps steps) reaches a target: NAME>=VALUE or "
                       "NAME<=VALUE with NAME a test_ metric the run reports, e.g. "
                       "test_acc>=0.95 or test_loss<=0.1 (time to accuracy). Every worker "
                       "stops within a step or two, the checkpoint is written and the run "
                       "exits 0")
    resume: str | None = opt(None, "resume from this checkpoint file or run folder")
    auto_resume: bool = opt(False, "continue the checkpoint in --run-dir when there is one, "
                            "else start fresh: for jobs that a scheduler restarts (Kubernetes, "
                            "Slurm requeue). Without it or --resume, hvdtrain refuses a --run-dir "
                            "that holds a checkpoint instead of overwriting it")
    log_steps: bool = opt(False, "also log one line per step (loss averaged across workers; "
                          "costs one small allreduce per step)")
    tensorboard: bool = opt(False, "also write TensorBoard event files to the run folder: losses, "
                            "metrics, learning rate, samples per second, the async staleness "
                            "histogram, and each step with --log-steps. View them with "
                            "tensorboard --logdir runs/")
    tracker: str = opt("", "also log the run to an experiment tracker: mlflow, wandb, or "
                       "mlflow,wandb. One tracker run per job, from the main process: the "
                       "header (config, world, versions) as parameters, every line's figures "
                       "at the global step; a resume continues it. MLflow writes to "
                       "mlflow.db in the run folder unless MLFLOW_TRACKING_URI is set; W&B "
                       "runs offline in the run folder unless you have logged in. A tracker "
                       "that fails warns once and training goes on (docs/trackers.md)")
    tracker_project: str = opt("hvdtrain", "with --tracker: the MLflow experiment or W&B "
                               "project the run goes into")
    tracker_artifacts: bool = opt(False, "with --tracker: also upload checkpoint.pt and best.pt "
                                  "(--keep-best) as artifacts at the end of the run")
    progress: bool = opt(True, "show the progress bar on the main process")
    device: str = opt("auto", "auto (a GPU per local rank when CUDA is present), cpu or cuda; "
                      "in async mode each worker takes a GPU and the servers stay on the CPU")
    precision: str = opt("32", "32 (float32), bf16 (autocast to bfloat16, on CPUs and GPUs) or "
                         "fp16 (autocast to float16 with a dynamic loss scale, for GPUs; steps "
                         "whose gradient overflows are skipped). Parameters, gradients and "
                         "optimizer state stay float32", choices=("32", "bf16", "fp16"))
    compile: bool = opt(False, "compile the model (each pipeline stage) with torch.compile; "
                        "the first steps take longer while it compiles")
    threads: int = opt(0, "torch intra-op threads per process (0: cores / processes per host, "
                          "and ranks that no launcher bound get a share of the cores each)")
    deterministic: bool = opt(False, "use deterministic torch kernels (for exact resume on GPU)")
    straggler: str = opt("", "slow workers down, to study stragglers: 3x (the last worker's "
                         "steps take 3 times as long) or 50ms (it waits 50 ms per step); "
                         "3x@0.1 or 50ms@0.1 (at each step, with probability 0.1, one random "
                         "worker is slowed so); exp:50ms or pareto:50ms (every worker waits a "
                         "random delay with mean 50 ms at each step: exponential, or Pareto "
                         "with shape 1.5, heavy-tailed). Random draws follow --seed. A factor "
                         "stretches the worker's compute in proportion to its samples, as a "
                         "slower device does (--balance can remove it); a fixed delay is a "
                         "cost per step that no batch share removes")
    inject_faults: str = opt("", "inject faults, to test recovery: events separated by ';', "
                             "each kill:rank=R,step=S (SIGKILL, as an OOM kill), "
                             "stop:rank=R,step=S,seconds=T (the process frozen for T s), "
                             "slow:rank=R,steps=A-B,factor=F (steps A to B compute F times as "
                             "long) or exception:rank=R,step=S (an error in the loop). R: the "
                             "world rank of a training process (async: a worker, 0..W-1); S: "
                             "the job's global step, after which it fires, once per job (the "
                             "run folder and each checkpoint record it, so a resumed run, also "
                             "one into another --run-dir, does not fire it again); a step after "
                             "the run's last is refused")
    peak_tflops: float = opt(0.0, "peak TFLOP/s of one device at this run's --precision, for "
                             "the mfu field of the epoch lines (achieved TFLOP/s over peak x "
                             "devices); 0: look the GPU up in a table of common ones (on a "
                             "CPU: no mfu)")
    slow_rank_factor: float = opt(1.5, "warn, once per epoch, about a worker whose median "
                                  "compute time per step is this many times the median of "
                                  "the others' (naming its rank, host and PID); 0: never warn")

    def validate(self) -> None:
        r = self
        r._check_counts()
        require(0 <= r.seed <= MAX_SEED, "--seed", r.seed, SEED_RANGE)
        if r.tensorboard:
            import importlib.util
            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("--tensorboard needs the tensorboard package, which is not "
                                  "installed: pip install tensorboard (or leave out --tensorboard)")
        if r.tracker:
            check_tracker(r.tracker, r.tracker_project)
        if r.auto_resume and not r.run_dir:
            # With --resume A as well: a requeued job continues its own checkpoint in --run-dir
            # once it has written one, and starts from A before that (loop/checkpointer.py).
            raise ConfigError("--auto-resume continues the checkpoint in --run-dir: pass "
                              "--run-dir")
        try:
            parse_straggler(r.straggler)
        except ValueError as e:
            raise ConfigError(f"--straggler: invalid value {r.straggler!r}; {e}") from None
        check_faults(r.inject_faults)
        try:
            parse_metric_goal(r.keep_best)
        except ValueError as e:
            raise ConfigError(f"--keep-best: invalid value {r.keep_best!r}; {e}") from None
        try:
            parse_stop_at(r.stop_at)
        except ValueError as e:
            raise ConfigError(f"--stop-at: invalid value {r.stop_at!r}; {e}") from None
        require(r.early_stop_patience >= 0, "--early-stop-patience", r.early_stop_patience,
                "use 0 (never stop early) or a number of evaluations, e.g. 3")
        if r.early_stop_patience and not r.keep_best:
            raise ConfigError("--early-stop-patience watches the metric of --keep-best: pass "
                              "--keep-best METRIC too (e.g. --keep-best test_acc), or drop "
                              "--early-stop-patience")
        require(r.device in ("auto", "cpu", "cuda") or r.device.startswith("cuda:"), "--device",
                r.device, "use auto, cpu, cuda or cuda:N")
        if r.run_dir:
            check_writable_folder(r.run_dir, "--run-dir")

    def _check_counts(self) -> None:
        """The numbers that must lie in a range: counts, steps, factors."""
        r = self
        require(r.epochs >= 1, "--epochs", r.epochs, "train for at least one epoch, e.g. --epochs 10")
        require(r.batch_size >= 1, "--batch-size", r.batch_size,
                "use a positive per-worker batch, e.g. --batch-size 32")
        require(r.max_steps_per_epoch >= 0, "--max-steps-per-epoch", r.max_steps_per_epoch,
                "use 0 for no limit or a positive step count")
        require(r.eval_every >= 1, "--eval-every", r.eval_every, "evaluate every N >= 1 epochs")
        require(r.eval_every_steps >= 0, "--eval-every-steps", r.eval_every_steps,
                "use 0 (epoch ends only) or a number of steps, e.g. 10")
        require(r.checkpoint_every >= 0, "--checkpoint-every", r.checkpoint_every,
                "use 0 (only at the end) or a positive number of epochs")
        require(r.checkpoint_steps >= 0, "--checkpoint-steps", r.checkpoint_steps,
                "use 0 (at epoch ends only) or a positive number of steps")
        require(r.peak_tflops >= 0, "--peak-tflops", r.peak_tflops,
                "use 0 (look the GPU up) or a device's peak, e.g. 989 for an H100 in bf16")
        require(r.threads >= 0, "--threads", r.threads, "use 0 (automatic) or a positive count")
        require(r.slow_rank_factor == 0 or r.slow_rank_factor > 1, "--slow-rank-factor",
                r.slow_rank_factor, "use 0 (never warn) or a factor above 1, e.g. 1.5")
