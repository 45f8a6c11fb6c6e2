"""Train the residual net on the digits through hvdtrain.fit, under any launcher, and write what
this rank's fit returned to OUT_DIR/rank<R>.json, so a test can check that every rank (parameter
servers included) got the same result.

Usage: fit_script.py OUT_DIR [option=value ...]
Each option is one of fit()'s keyword options; its value is read as JSON when it parses (so
epochs=3 is an int), else kept as a string (mode=async). The data are the digits as map-style
Datasets (user_data.digits), so they go through hvdtrain's DataLoader path.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import hvdtrain

from residual_net import build  # this folder is on sys.path: it holds this script
from user_data import digits


def parse_options(pairs):
    options = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        try:
            options[name] = json.loads(text)
        except json.JSONDecodeError:
            options[name] = text
    return options


def digests(tensors):
    """{name: sha256 of the tensor's bytes}: equal digests, equal tensors."""
    return {name: hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
            for name, t in tensors}


def main():
    out = Path(sys.argv[1])
    train, test = digits()

    options = parse_options(sys.argv[2:])
    result = hvdtrain.fit(lambda: build((1, 8, 8), 10), train, test,
                          loss="cross_entropy", **options)
    returned = {
        "history": result.history,
        "final": result.final,
        "run_dir": str(result.run_dir),
        "log_path": str(result.log_path),
        "checkpoint_path": str(result.checkpoint_path),
        "has_model": result.model is not None,
        "model_training": None if result.model is None else result.model.training,
        "parameters": None if result.model is None else digests(result.model.named_parameters()),
        "buffers": None if result.model is None else digests(result.model.named_buffers()),
    }
    if options.get("mode") == "sync":  # the trained model trains again: fine-tuning
        again = hvdtrain.fit(result.model, train, test, loss="cross_entropy",
                             **{**options, "epochs": 1, "warmup_epochs": 0,
                                "run_dir": options["run_dir"] + "-again"})
        returned["again"] = again.final

    # Distributed: the launcher's rank, only to name this process's file.
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))
    (out / f"rank{rank}.json").write_text(json.dumps(returned))

if __name__ == "__main__":  # loader processes may import this file; they must not train
    main()
