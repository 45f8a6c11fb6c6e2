"""The options of layer-split model parallelism inside each rank."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, require
from .values import UnreadOption, opt


@dataclass
class PipelineConfig:
    """Layer-split model parallelism inside each rank (pipeline stages fed micro-batches)."""

    stages: int = opt(1, "split each replica by layers into this many pipeline stages, each on "
                      "its own device (1: no split)")
    devices: str = opt("auto", "the stages' devices: auto, cpu, cuda (rank r takes "
                       "cuda:r*K+k for stage k), or a list such as cuda:0,cuda:1 or cpu,cpu "
                       "with one entry per stage, or one per stage of every rank on the host")
    split_points: tuple[int, ...] = opt((), "layer indices where stages 2..K begin, e.g. 3 "
                                        "(default: balance the stages by parameter count)")
    micro_batches: int = opt(1, "micro-batches per batch; the stages work on different "
                             "micro-batches at the same time")
    schedule: str = opt("gpipe", "gpipe (all forwards, then all backwards), 1f1b (one forward, "
                        "one backward: fewer activations in flight), or sequential (one stage "
                        "after another, no overlap: the naive split)",
                        choices=("gpipe", "1f1b", "sequential"))

    def validate(self) -> None:
        pl = self
        require(pl.stages >= 1, "--stages", pl.stages, "use 1 (no split) or more stages")
        require(pl.micro_batches >= 1, "--micro-batches", pl.micro_batches, "use 1 or more")
        if pl.stages == 1:  # the pipeline's own flags do nothing without one: ran as a plain run
            given = [(f"{flag} {value}", flag) for flag, value, is_set in (
                ("--micro-batches", pl.micro_batches, pl.micro_batches != 1),
                ("--schedule", pl.schedule, pl.schedule != "gpipe"),
                ("--devices", pl.devices, pl.devices != "auto"),
                ("--split-points", ",".join(map(str, pl.split_points)), bool(pl.split_points)))
                if is_set]
            if given:
                what = "pipeline options" if len(given) > 1 else "a pipeline option"
                raise UnreadOption(f"{', '.join(shown for shown, _ in given)}: {what}, for a "
                                   "replica split into stages; add --stages K (2 or more), or "
                                   "drop it (the device of an unsplit replica is --device)",
                                   given[0][1][2:].replace("-", "_"))
        if pl.split_points:
            require(len(pl.split_points) == pl.stages - 1, "--split-points", pl.split_points,
                    f"--stages {pl.stages} needs {pl.stages - 1} split point(s), got "
                    f"{len(pl.split_points)}")
