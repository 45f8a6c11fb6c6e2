"""Every option of a training run, as documented dataclasses.

Each field's ``metadata["help"]`` is its documentation and also its ``--flag`` help text, so the
command line (cli.py), a TOML/YAML config file and the code all read one source. Validation lives
here too: :meth:`Config.validate` rejects impossible values before any process starts talking,
with a message that names the flag and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError  # also config.ConfigError, the name most callers import
from .faults.schedule import parse_faults
from .stragglers import parse_straggler


# The seeds feed torch, numpy and scikit-learn, whose generators take at most 64 (torch) or 32
# bits (scikit-learn's random_state); epoch_plan.py also derives per-epoch seeds from --seed.
MAX_SEED = 2**32 - 1
MAX_CYCLE_TIME_MS = 1000.0
MIN_CHUNK_MB = 0.001  # about 1 KiB: 262 float32 parameters per message
SEED_RANGE = f"use a whole number from 0 to {MAX_SEED} (2**32 - 1), e.g. 0"


def _opt(default: Any, help: str, choices: tuple | None = None, **kw) -> Any:
    """A dataclass field whose metadata carries its help text (and allowed values)."""
    meta = {"help": help, "choices": choices, **kw}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    """Where the samples come from and how they are split."""

    dataset: str = _opt("digits", "digits (scikit-learn's bundled 8x8 digits), synthetic, "
                        "mnist (a folder of IDX files), npz (a file with x and y arrays), folder "
                        "(one subfolder of PNG/JPEG images per class, read lazily), or your own "
                        "MODULE:CALLABLE returning (train, test): Datasets, IterableDatasets or "
                        "(x, y) tensor pairs; MODULE is a dotted import path or a .py file")
    dataset_args: str = _opt("", "keyword arguments for your --dataset callable, as a JSON "
                             "object, e.g. '{\"root\": \"data/\"}'")
    data_path: str | None = _opt(None, "folder of MNIST IDX files, the .npz file, or the image "
                                 "folder; required for --dataset mnist|npz|folder")
    data_workers: int = _opt(0, "DataLoader processes per worker for Dataset inputs (started "
                             "with forkserver, persistent across epochs); 0 loads in the "
                             "training process. In-memory data never uses a DataLoader")
    test_fraction: float = _opt(0.2, "share of samples held out for testing (stratified), "
                                "when the dataset has no test split of its own")
    data_seed: int = _opt(0, "seed of the train/test split and of synthetic data")
    synthetic_samples: int = _opt(8192, "number of samples in --dataset synthetic")
    synthetic_shape: tuple[int, ...] = _opt((1024,), "shape of one synthetic sample, "
                                            "e.g. 1024 or 1x28x28")
    synthetic_classes: int = _opt(10, "number of classes in --dataset synthetic")
    sparse_labels: bool = _opt(False, "--dataset npz|mnist: accept labels whose range is far "
                               "larger than the labels in use (max label + 1 classes are "
                               "built); without it hvdtrain refuses more unused class indices "
                               "than both the distinct labels and 1000, usually raw ids that "
                               "were meant to be renumbered 0..K-1")

    def validate(self) -> None:
        d = self
        _require(0 < d.test_fraction < 1, "--test-fraction", d.test_fraction,
                 "hold out a share strictly between 0 and 1, e.g. 0.2")
        _require(d.synthetic_samples >= 2, "--synthetic-samples", d.synthetic_samples,
                 "use at least 2 samples")
        _require(len(d.synthetic_shape) >= 1 and all(n >= 1 for n in d.synthetic_shape),
                 "--synthetic-shape", d.synthetic_shape, "give positive sizes such as 1024 or 1x28x28")
        _require(d.synthetic_classes >= 2, "--synthetic-classes", d.synthetic_classes,
                 "use at least 2 classes")
        if d.dataset in ("mnist", "npz", "folder"):
            _require(bool(d.data_path), "--data-path", d.data_path,
                     f"--dataset {d.dataset} reads local files: pass --data-path "
                     + {"mnist": "FOLDER holding train-images-idx3-ubyte etc.",
                        "npz": "FILE.npz holding arrays x and y",
                        "folder": "FOLDER with one subfolder of images per class"}[d.dataset])
        _require(d.data_workers >= 0, "--data-workers", d.data_workers,
                 "use 0 (load in the training process) or a number of loader processes")
        _require(0 <= d.data_seed <= MAX_SEED, "--data-seed", d.data_seed, SEED_RANGE)


@dataclass
class ModelConfig:
    """Which network to train. Input and output sizes come from the dataset."""

    model: str = _opt("mlp", "a built-in model (the registry in hvdtrain/models.py) "
                      "or your own MODULE:CALLABLE returning an nn.Module; MODULE is a dotted "
                      "import path or a .py file, and the callable also receives input_shape "
                      "and num_classes when its signature names them")
    model_args: str = _opt("", "keyword arguments for your --model callable, as a JSON object, "
                           "e.g. '{\"width\": 64}'")
    loss: str = _opt("cross_entropy", "cross_entropy, nll, mse, l1, bce_with_logits, or your own "
                     "MODULE:CALLABLE computing loss(output, target) -> scalar mean; accuracy is "
                     "reported for cross_entropy and nll on (N, C) outputs")
    hidden: tuple[int, ...] = _opt((256, 128), "hidden layer widths of the MLP, e.g. 1024,1024")
    channels: tuple[int, ...] = _opt((32, 64), "convolution channels of the CNN, one per block")

    def validate(self) -> None:
        m = self
        _require(len(m.hidden) >= 1 and all(n >= 1 for n in m.hidden), "--hidden", m.hidden,
                 "give positive layer widths, e.g. --hidden 256,128")
        _require(len(m.channels) >= 1 and all(n >= 1 for n in m.channels), "--channels",
                 m.channels, "give positive channel counts, e.g. --channels 32,64")


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule."""

    optimizer: str = _opt("sgd", "sgd (with --momentum), adam or adamw",
                          choices=("sgd", "adam", "adamw"))
    lr: float = _opt(0.05, "learning rate of one worker; it is scaled by the world size "
                     "(see --lr-scaling)")
    momentum: float = _opt(0.9, "SGD momentum")
    weight_decay: float = _opt(0.0, "L2 penalty (decoupled for adamw)")
    lr_scaling: str = _opt("linear", "linear: multiply --lr by the number of workers "
                           "(Goyal et al. 2017); none: use --lr as is",
                           choices=("linear", "none"))
    warmup_epochs: float = _opt(1.0, "epochs over which the learning rate ramps from --lr to "
                                "the scaled rate; 0 disables warmup")
    lr_schedule: str = _opt("constant", "after warmup: constant, or cosine decay to 0",
                            choices=("constant", "cosine"))
    clip_grad_norm: float = _opt(0.0, "clip the gradient to this total L2 norm before each "
                                 "update (0: no clipping): sync the averaged one, async each "
                                 "worker's own; see docs/gpu.md")

    def validate(self) -> None:
        o = self
        _require(math.isfinite(o.lr) and o.lr > 0, "--lr", o.lr,
                 "pass a positive learning rate, e.g. --lr 0.05")
        _require(0 <= o.momentum < 1, "--momentum", o.momentum, "use a value in [0, 1), e.g. 0.9")
        _require(o.weight_decay >= 0, "--weight-decay", o.weight_decay, "use 0 or a positive value")
        _require(o.warmup_epochs >= 0, "--warmup-epochs", o.warmup_epochs,
                 "use 0 (no warmup) or a positive number of epochs")
        _require(o.clip_grad_norm >= 0, "--clip-grad-norm", o.clip_grad_norm,
                 "use 0 (no clipping) or a positive norm, e.g. 1")


@dataclass
class SyncConfig:
    """Horovod settings for --mode sync."""

    compression: str = _opt("none", "gradient compression on the wire: none or fp16",
                            choices=("none", "fp16"))
    reduce_op: str = _opt("average", "how gradients combine: average, or adasum "
                          "(Maleki et al. 2020; the learning rate is then not scaled on CPU)",
                          choices=("average", "adasum"))
    backward_passes_per_step: int = _opt(1, "gradient accumulation: split each per-worker "
                                         "batch into this many backward passes before one "
                                         "allreduce and update")
    local_steps: int = _opt(1, "local SGD (Lin et al. 2020): each worker takes this many "
                            "optimizer steps on its own gradients, then the workers average "
                            "their parameters and BatchNorm statistics; 1 averages the gradient "
                            "of every step (plain sync). The optimizer state (momentum, Adam "
                            "moments) stays local between rounds and is averaged only at epoch "
                            "ends and checkpoints, where the model is also averaged whatever "
                            "the step count; --clip-grad-norm and the fp16 loss scale then "
                            "apply to each worker's own gradient")
    outer_lr: float = _opt(0.0, "DiLoCo (Douillard et al. 2023) on top of --local-steps H: "
                           "every H steps the workers average how far their inner steps moved "
                           "them (the round's start minus their parameters), and an outer SGD "
                           "with this learning rate (and --outer-momentum, Nesterov) steps the "
                           "round's start with it; 0.7 in the paper. 0: plain local SGD, the "
                           "parameters averaged. The outer step multiplies a round's progress "
                           "by LR / (1 - M) once its momentum has built up, so the workers' "
                           "rate (--lr times N under --lr-scaling linear) is divided by that. "
                           "The outer momentum is checkpointed")
    outer_momentum: float = _opt(0.0, "--outer-lr: Nesterov momentum of the outer SGD, in "
                                 "[0, 1); 0.9 in the paper. 0: plain outer SGD")
    fusion_threshold_mb: float = _opt(64.0, "Horovod tensor fusion buffer in MiB "
                                      "(HOROVOD_FUSION_THRESHOLD); 0 disables fusion")
    elastic: bool = _opt(False, "Horovod elastic training: survive lost workers and take in new "
                         "ones (launch with horovodrun --gloo --min-np/--max-np "
                         "--host-discovery-script)")
    elastic_commit_steps: int = _opt(50, "--elastic: commit the model, optimizer and progress "
                                     "every N steps (and at each epoch's end); a reset redoes at "
                                     "most this many steps")
    sync_batchnorm: bool = _opt(False, "turn the model's BatchNorm layers into Horovod's "
                                "SyncBatchNorm, so batch statistics cover the global batch")
    balance: bool = _opt(False, "batch shares that follow measured speed: the global batch "
                         "(--batch-size x workers) stays fixed, and at each epoch's end every "
                         "worker's share of it for the next epoch is re-planned in proportion to "
                         "its measured throughput (samples per second of compute), so a slow "
                         "worker trains fewer samples per step instead of holding the others "
                         "up. Gradients are weighted by the shares: the update is the global "
                         "batch's, as with equal shares. See docs/sync.md")
    balance_floor: float = _opt(0.25, "--balance: the smallest share, as a fraction of the "
                                "equal share --batch-size (rounded up to whole multiples of "
                                "--backward-passes-per-step); keeps a slow worker in every step, "
                                "so its speed is still measured and a recovered one regains its "
                                "share")
    balance_damping: float = _opt(0.5, "--balance: how far each re-plan moves the shares toward "
                                  "the measured speeds, in (0, 1]; 1 all the way, less to keep "
                                  "them from swinging where step times are noisy")
    stall_timeout_s: float = _opt(300.0, "a rank that makes no progress (no step, evaluation "
                                  "or checkpoint) for this many seconds ends the job with an "
                                  "error naming the rank that stopped, instead of hanging; make "
                                  "it longer than your slowest step, evaluation or checkpoint "
                                  "write (0: never). Also Horovod's own stall check")
    cycle_time_ms: float = _opt(0.0, "Horovod background cycle time in ms (HOROVOD_CYCLE_TIME). "
                                "0: chosen for you, 10 where Horovod starts each collective as "
                                "it is enqueued (hvdtrain's Horovod build, on CPUs), so the "
                                "cycle only paces Horovod's idle negotiation, else Horovod's 1 "
                                "(see docs/sync.md)")

    def validate(self) -> None:
        s = self
        _require(s.backward_passes_per_step >= 1, "--backward-passes-per-step",
                 s.backward_passes_per_step, "use 1 (no accumulation) or more")
        _require(s.fusion_threshold_mb >= 0, "--fusion-threshold-mb", s.fusion_threshold_mb,
                 "use 0 (no fusion) or a size in MiB, e.g. 64")
        # Every allreduce waits up to a cycle: 1e7 ms looked like a hang with no word.
        _require(0 <= s.cycle_time_ms <= MAX_CYCLE_TIME_MS, "--cycle-time-ms", s.cycle_time_ms,
                 f"use 0 (chosen for you) or a time in ms, at most {MAX_CYCLE_TIME_MS:g}, e.g. 1")
        _require(s.elastic_commit_steps >= 1, "--elastic-commit-steps", s.elastic_commit_steps,
                 "commit every N >= 1 steps, e.g. 50")
        _require(s.stall_timeout_s >= 0, "--stall-timeout-s", s.stall_timeout_s,
                 "use 0 (no stall check) or seconds, e.g. 300")
        _require(s.local_steps >= 1, "--local-steps", s.local_steps,
                 "use 1 (average every step's gradient) or more steps between parameter "
                 "averages, e.g. 4")
        if s.local_steps > 1:
            s._check_local_sgd()
        s._check_outer_step()
        _require(0 < s.balance_floor <= 1, "--balance-floor", s.balance_floor,
                 "use a fraction of the equal share in (0, 1], e.g. 0.25")
        _require(0 < s.balance_damping <= 1, "--balance-damping", s.balance_damping,
                 "use a value in (0, 1], e.g. 0.5 (1: move all the way at each re-plan)")
        if s.balance:
            s._check_balance()
        else:  # silently ignored, they would look like settings that took effect
            for name in ("balance_floor", "balance_damping"):
                flag = "--" + name.replace("_", "-")
                _require(getattr(s, name) == getattr(SyncConfig, name), flag, getattr(s, name),
                         f"it tunes --balance, which this run does not use: add --balance, or "
                         f"drop {flag}")

    def _check_balance(self) -> None:
        """Where unequal shares of a weighted average have no correct form."""
        if self.reduce_op == "adasum":
            raise ConfigError("--balance weights each worker's gradient by its share of the "
                              "global batch and averages them; --reduce-op adasum combines "
                              "gradients by their directions, not as a weighted average, so the "
                              "shares would change the update: drop one of them")
        if self.local_steps > 1:
            raise ConfigError(f"--balance gives the workers unequal shares of each step's "
                              f"gradient, and --local-steps {self.local_steps} averages "
                              "parameters after local steps, where a worker with a smaller share "
                              "takes noisier steps of the same weight: use --local-steps 1 with "
                              "--balance, or drop --balance")
        if self.elastic:
            raise ConfigError("--balance does not work with --elastic: a reset changes the "
                              "workers, and with them the shares, in the middle of an epoch; "
                              "drop one of them")

    def _check_outer_step(self) -> None:
        """DiLoCo's outer optimizer: a positive rate over the rounds of --local-steps H > 1."""
        _require(math.isfinite(self.outer_lr) and self.outer_lr >= 0, "--outer-lr",
                 self.outer_lr, "use a positive outer learning rate, e.g. 0.7 (DiLoCo), or "
                 "leave it out for plain local SGD")
        _require(0 <= self.outer_momentum < 1, "--outer-momentum", self.outer_momentum,
                 "use a value in [0, 1), e.g. 0.9")
        if self.outer_momentum and not self.outer_lr:
            raise ConfigError("--outer-momentum is the momentum of DiLoCo's outer step, which "
                              "--outer-lr turns on: add --outer-lr (e.g. 0.7) and --local-steps "
                              "H, or drop --outer-momentum")
        if self.outer_lr and self.local_steps == 1:
            raise ConfigError(f"--outer-lr {self.outer_lr:g} steps the average of rounds of "
                              "local steps, and --local-steps 1 has none (every gradient is "
                              "averaged); add --local-steps H with H > 1, e.g. 8, or drop "
                              "--outer-lr")

    def _check_local_sgd(self) -> None:
        """Options that mean nothing, or have no correct form, when each worker steps on its
        own and only the parameters are averaged (--local-steps H > 1)."""
        h = f"--local-steps {self.local_steps}"
        if self.elastic:
            raise ConfigError(f"{h} does not work with --elastic: a commit inside an averaging "
                              "round would hold one worker's parameters, not the average; use "
                              "--local-steps 1 with --elastic, or drop --elastic")
        if self.reduce_op == "adasum":
            raise ConfigError(f"{h} averages parameters, and --reduce-op adasum combines "
                              "gradients, which local SGD never sends; drop --reduce-op adasum "
                              "or use --local-steps 1")
        if self.sync_batchnorm:
            raise ConfigError(f"--sync-batchnorm allreduces batch statistics in every forward "
                              f"pass, the per-step communication that {h} is there to save; "
                              "drop --sync-batchnorm (BatchNorm running statistics are averaged "
                              "with the parameters) or use --local-steps 1")
        if self.compression != "none":
            raise ConfigError(f"--compression {self.compression} compresses gradients, and with "
                              f"{h} only parameters are sent, in full precision (rounded weights "
                              "would lose the small updates); drop --compression or use "
                              "--local-steps 1")


@dataclass
class PSConfig:
    """Parameter-server settings for --mode async (launch with mpirun: S servers + N-S workers)."""

    num_servers: int = _opt(1, "server processes; the last S ranks serve, the others train")
    staleness: float = _opt(math.inf, "SSP bound: no worker may be more than this many pushes "
                            "ahead of the slowest; 0 is lock-step, inf (as in MXNet "
                            "dist_async) fully asynchronous; see docs/async.md",
                            infinite_ok=True)
    pull_every: int = _opt(1, "pull fresh parameters after every k-th push")
    bsp: bool = _opt(False, "lock-step averaging through the server: each round's gradients "
                     "are averaged and applied once, like sync training")
    backup_workers: int = _opt(0, "--bsp with b backup workers (Chen et al. 2016): each round "
                               "applies the first N-b gradients and drops the later ones; the "
                               "learning rate scales by N-b. 0: plain --bsp; see docs/async.md")
    dc_lambda: float = _opt(0.0, "delay compensation (DC-ASGD, Zheng et al. 2017): "
                            "g + lambda*g*g*(w_now - w_pulled); 0 disables, ~0.04 is typical")
    staleness_lr: bool = _opt(False, "staleness-aware learning rate (Zhang et al. 2016): the "
                              "server scales the step of a gradient computed s updates ago by "
                              "1/max(1, s)")
    eval_pauses_workers: bool = _opt(False, "while worker 0 evaluates, no other worker trains, "
                                     "as in sync mode, so that a time to target counts no free "
                                     "steps; hvdtrain compare turns it on; see docs/async.md")
    chunk_mb: float = _opt(1.0, "gradient and parameter messages travel in chunks of this many "
                           "MiB, so the server updates one chunk while the next is in flight")
    timeout_s: float = _opt(300.0, "seconds of silence from a process (a worker that sends "
                            "nothing while the others train, servers that send no reply, "
                            "workers that never reach the end) before the job is declared "
                            "stuck and ended with an error (0: wait forever); a slow worker is "
                            "never silent: each of its steps is a message")
    max_restarts: int = _opt(0, "replace up to this many lost workers with new processes "
                             "(MPI_Comm_spawn from server 0), which pull the current "
                             "parameters and train on; needs mpirun's recovery settings and "
                             "--num-servers 1; see docs/async.md")
    shared_memory: bool = _opt(True, "between a server and the workers on its host, keep "
                               "gradients and parameters in an MPI shared-memory window instead "
                               "of copying them through messages")

    def validate(self) -> None:
        p = self
        _require(p.num_servers >= 1, "--num-servers", p.num_servers, "use at least 1 server")
        _require(p.staleness >= 0, "--staleness", p.staleness,
                 "use 0 (lock-step), a positive bound such as 4, or inf (fully asynchronous)")
        _require(p.pull_every >= 1, "--pull-every", p.pull_every, "pull every k >= 1 pushes")
        _require(p.dc_lambda >= 0, "--dc-lambda", p.dc_lambda, "use 0 (off) or a small positive "
                 "value such as 0.04")
        # A message per few parameters: 1e-7 (one float per message) looked like a hang.
        _require(p.chunk_mb >= MIN_CHUNK_MB, "--chunk-mb", p.chunk_mb,
                 f"use a size in MiB of at least {MIN_CHUNK_MB:g} (smaller chunks only add "
                 "per-message overhead), e.g. 1")
        _require(p.timeout_s >= 0, "--timeout-s", p.timeout_s, "use 0 (wait forever) or seconds")
        _require(p.max_restarts >= 0, "--max-restarts", p.max_restarts,
                 "use 0 (no replacement) or the number of lost workers to replace, e.g. 1")
        _require(p.backup_workers >= 0, "--backup-workers", p.backup_workers,
                 "use 0 (plain --bsp) or a positive number below the number of workers, "
                 "e.g. 1")


@dataclass
class PipelineConfig:
    """Layer-split model parallelism inside each rank (pipeline stages fed micro-batches)."""

    stages: int = _opt(1, "split each replica by layers into this many pipeline stages, each on "
                       "its own device (1: no split)")
    devices: str = _opt("auto", "the stages' devices: auto, cpu, cuda (rank r takes "
                        "cuda:r*K+k for stage k), or a list such as cuda:0,cuda:1 or cpu,cpu "
                        "with one entry per stage, or one per stage of every rank on the host")
    split_points: tuple[int, ...] = _opt((), "layer indices where stages 2..K begin, e.g. 3 "
                                         "(default: balance the stages by parameter count)")
    micro_batches: int = _opt(1, "micro-batches per batch; the stages work on different "
                              "micro-batches at the same time")
    schedule: str = _opt("gpipe", "gpipe (all forwards, then all backwards), 1f1b (one forward, "
                         "one backward: fewer activations in flight), or sequential (one stage "
                         "after another, no overlap: the naive split)",
                         choices=("gpipe", "1f1b", "sequential"))

    def validate(self) -> None:
        pl = self
        _require(pl.stages >= 1, "--stages", pl.stages, "use 1 (no split) or more stages")
        _require(pl.micro_batches >= 1, "--micro-batches", pl.micro_batches, "use 1 or more")
        if pl.split_points:
            _require(len(pl.split_points) == pl.stages - 1, "--split-points", pl.split_points,
                     f"--stages {pl.stages} needs {pl.stages - 1} split point(s), got "
                     f"{len(pl.split_points)}")


@dataclass
class RunConfig:
    """The loop: how long, how big, where the results go."""

    mode: str = _opt("sync", "update scheme: sync (Horovod allreduce) or async (parameter "
                     "server over MPI; launch with mpirun)", choices=("sync", "async"))
    epochs: int = _opt(20, "passes over the training split")
    batch_size: int = _opt(32, "samples per worker per optimizer step; the global batch is "
                           "this times the number of workers")
    seed: int = _opt(0, "seed of model initialisation and data shuffling")
    max_steps_per_epoch: int = _opt(0, "stop each epoch after this many steps (0: no limit); "
                                    "for benchmarks and quick checks")
    eval_every: int = _opt(1, "evaluate test accuracy every N epochs (and always at the end)")
    eval_every_steps: int = _opt(0, "also evaluate every N steps (of worker 0) inside the epochs "
                                 "and log an eval line stamped with the wall time (0: only at "
                                 "epoch ends); what compare uses to time the target to a few "
                                 "percent. Early stopping and --keep-best still follow the "
                                 "epoch evaluations")
    run_dir: str | None = _opt(None, "folder for the metrics log and checkpoints "
                               "(default: runs/<time>-<mode>-<dataset>-<model>)")
    checkpoint_every: int = _opt(1, "write a checkpoint every N epochs (0: only at the end)")
    checkpoint_steps: int = _opt(0, "also write one every N steps inside an epoch, so a crash "
                                 "in a long epoch loses at most N steps (0: at epoch ends only)")
    async_checkpoint: bool = _opt(False, "write checkpoints in a background thread: a step "
                                  "waits only while the state is copied to CPU memory, then "
                                  "training goes on while the copy is written (atomically, as "
                                  "always). A save waits for the write before it; a stop, "
                                  "best.pt and the end of the run wait for the last one")
    keep_best: str = _opt("", "also keep best.pt in the run folder, the checkpoint of the best "
                          "evaluation so far by this metric: test_loss, test_acc or any test_ "
                          "metric the run reports. Names ending in loss are minimised, others "
                          "maximised; a min: or max: prefix says which, e.g. min:test_mae")
    early_stop_patience: int = _opt(0, "stop when the --keep-best metric has not improved in N "
                                    "evaluations (0: never); the run then writes its final "
                                    "checkpoint and exits 0")
    stop_at: str = _opt("", "stop training once an evaluation (at an epoch's end, or every "
                        "--eval-every-steps steps) reaches a target: NAME>=VALUE or "
                        "NAME<=VALUE with NAME a test_ metric the run reports, e.g. "
                        "test_acc>=0.95 or test_loss<=0.1 (time to accuracy). Every worker "
                        "stops within a step or two, the checkpoint is written and the run "
                        "exits 0")
    resume: str | None = _opt(None, "resume from this checkpoint file or run folder")
    auto_resume: bool = _opt(False, "continue the checkpoint in --run-dir when there is one, "
                             "else start fresh: for jobs that a scheduler restarts (Kubernetes, "
                             "Slurm requeue). Without it or --resume, hvdtrain refuses a --run-dir "
                             "that holds a checkpoint instead of overwriting it")
    log_steps: bool = _opt(False, "also log one line per step (loss averaged across workers; "
                           "costs one small allreduce per step)")
    tensorboard: bool = _opt(False, "also write TensorBoard event files to the run folder: losses, "
                             "metrics, learning rate, samples per second, the async staleness "
                             "histogram, and each step with --log-steps. View them with "
                             "tensorboard --logdir runs/")
    tracker: str = _opt("", "also log the run to an experiment tracker: mlflow, wandb, or "
                        "mlflow,wandb. One tracker run per job, from the main process: the "
                        "header (config, world, versions) as parameters, every line's figures "
                        "at the global step; a resume continues it. MLflow writes to "
                        "mlflow.db in the run folder unless MLFLOW_TRACKING_URI is set; W&B "
                        "runs offline in the run folder unless you have logged in. A tracker "
                        "that fails warns once and training goes on (docs/trackers.md)")
    tracker_project: str = _opt("hvdtrain", "with --tracker: the MLflow experiment or W&B "
                                "project the run goes into")
    tracker_artifacts: bool = _opt(False, "with --tracker: also upload checkpoint.pt and best.pt "
                                   "(--keep-best) as artifacts at the end of the run")
    progress: bool = _opt(True, "show the progress bar on the main process")
    device: str = _opt("auto", "auto (a GPU per local rank when CUDA is present), cpu or cuda; "
                       "in async mode each worker takes a GPU and the servers stay on the CPU")
    precision: str = _opt("32", "32 (float32), bf16 (autocast to bfloat16, on CPUs and GPUs) or "
                          "fp16 (autocast to float16 with a dynamic loss scale, for GPUs; steps "
                          "whose gradient overflows are skipped). Parameters, gradients and "
                          "optimizer state stay float32", choices=("32", "bf16", "fp16"))
    compile: bool = _opt(False, "compile the model (each pipeline stage) with torch.compile; "
                         "the first steps take longer while it compiles")
    threads: int = _opt(0, "torch intra-op threads per process (0: cores / processes per host, "
                           "and ranks that no launcher bound get a share of the cores each)")
    deterministic: bool = _opt(False, "use deterministic torch kernels (for exact resume on GPU)")
    straggler: str = _opt("", "slow workers down, to study stragglers: 3x (the last worker's "
                          "steps take 3 times as long) or 50ms (it waits 50 ms per step); "
                          "3x@0.1 or 50ms@0.1 (at each step, with probability 0.1, one random "
                          "worker is slowed so); exp:50ms or pareto:50ms (every worker waits a "
                          "random delay with mean 50 ms at each step: exponential, or Pareto "
                          "with shape 1.5, heavy-tailed). Random draws follow --seed. A factor "
                          "stretches the worker's compute in proportion to its samples, as a "
                          "slower device does (--balance can remove it); a fixed delay is a "
                          "cost per step that no batch share removes")
    inject_faults: str = _opt("", "inject faults, to test recovery: events separated by ';', "
                              "each kill:rank=R,step=S (SIGKILL, as an OOM kill), "
                              "stop:rank=R,step=S,seconds=T (the process frozen for T s), "
                              "slow:rank=R,steps=A-B,factor=F (steps A to B compute F times as "
                              "long) or exception:rank=R,step=S (an error in the loop). R: the "
                              "world rank of a training process (async: a worker, 0..W-1); S: "
                              "the job's global step, after which it fires, once per job (the "
                              "run folder and each checkpoint record it, so a resumed run, also "
                              "one into another --run-dir, does not fire it again); a step after "
                              "the run's last is refused")
    peak_tflops: float = _opt(0.0, "peak TFLOP/s of one device at this run's --precision, for "
                              "the mfu field of the epoch lines (achieved TFLOP/s over peak x "
                              "devices); 0: look the GPU up in a table of common ones (on a "
                              "CPU: no mfu)")
    slow_rank_factor: float = _opt(1.5, "warn, once per epoch, about a worker whose median "
                                   "compute time per step is this many times the median of "
                                   "the others' (naming its rank, host and PID); 0: never warn")

    def validate(self) -> None:
        r = self
        r._check_counts()
        _require(0 <= r.seed <= MAX_SEED, "--seed", r.seed, SEED_RANGE)
        if r.tensorboard:
            import importlib.util
            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("--tensorboard needs the tensorboard package, which is not "
                                  "installed: pip install tensorboard (or leave out --tensorboard)")
        if r.tracker:
            _check_tracker(r.tracker, r.tracker_project)
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
        _require(r.early_stop_patience >= 0, "--early-stop-patience", r.early_stop_patience,
                 "use 0 (never stop early) or a number of evaluations, e.g. 3")
        if r.early_stop_patience and not r.keep_best:
            raise ConfigError("--early-stop-patience watches the metric of --keep-best: pass "
                              "--keep-best METRIC too (e.g. --keep-best test_acc), or drop "
                              "--early-stop-patience")
        _require(r.device in ("auto", "cpu", "cuda") or r.device.startswith("cuda:"), "--device",
                 r.device, "use auto, cpu, cuda or cuda:N")
        if r.run_dir:
            check_writable_folder(r.run_dir, "--run-dir")

    def _check_counts(self) -> None:
        """The numbers that must lie in a range: counts, steps, factors."""
        r = self
        _require(r.epochs >= 1, "--epochs", r.epochs, "train for at least one epoch, e.g. --epochs 10")
        _require(r.batch_size >= 1, "--batch-size", r.batch_size,
                 "use a positive per-worker batch, e.g. --batch-size 32")
        _require(r.max_steps_per_epoch >= 0, "--max-steps-per-epoch", r.max_steps_per_epoch,
                 "use 0 for no limit or a positive step count")
        _require(r.eval_every >= 1, "--eval-every", r.eval_every, "evaluate every N >= 1 epochs")
        _require(r.eval_every_steps >= 0, "--eval-every-steps", r.eval_every_steps,
                 "use 0 (epoch ends only) or a number of steps, e.g. 10")
        _require(r.checkpoint_every >= 0, "--checkpoint-every", r.checkpoint_every,
                 "use 0 (only at the end) or a positive number of epochs")
        _require(r.checkpoint_steps >= 0, "--checkpoint-steps", r.checkpoint_steps,
                 "use 0 (at epoch ends only) or a positive number of steps")
        _require(r.peak_tflops >= 0, "--peak-tflops", r.peak_tflops,
                 "use 0 (look the GPU up) or a device's peak, e.g. 989 for an H100 in bf16")
        _require(r.threads >= 0, "--threads", r.threads, "use 0 (automatic) or a positive count")
        _require(r.slow_rank_factor == 0 or r.slow_rank_factor > 1, "--slow-rank-factor",
                 r.slow_rank_factor, "use 0 (never warn) or a factor above 1, e.g. 1.5")


def check_faults(schedule: str, flag: str = "--inject-faults") -> None:
    try:
        parse_faults(schedule)
    except ValueError as e:
        raise ConfigError(f"{flag}: invalid value {schedule!r}; {e}") from None


def _check_tracker(text: str, project: str) -> None:
    from .trackers.names import missing_package, project_problem, tracker_names
    try:
        names = tracker_names(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    problem = missing_package(names) or project_problem(names, project)
    if problem:
        raise ConfigError(problem)


SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig,
            "sync": SyncConfig, "ps": PSConfig, "pipeline": PipelineConfig, "run": RunConfig}
RECORDED_ARGS_LIMIT = 64 * 1024  # bytes of --model-args/--dataset-args copied into the records


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    run: RunConfig = field(default_factory=RunConfig)

    # --- building -----------------------------------------------------------------------------
    @classmethod
    def from_overrides(cls, values: dict[str, Any]) -> "Config":
        """Build from flat ``{field_name: value}`` pairs; names are unique across sections."""
        cfg = cls()
        owner = field_owners()
        for name, value in values.items():
            if name not in owner:
                raise ConfigError(f"unknown option {name!r}; valid options are: "
                                  f"{', '.join(sorted(owner))}")
            section = getattr(cfg, owner[name])
            setattr(section, name, coerce(section, name, value))
        return cfg

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_record(self) -> dict[str, dict[str, Any]]:
        """to_dict for what the run records again and again (every checkpoint, the log's header,
        a tracker's parameters): keyword arguments longer than RECORDED_ARGS_LIMIT (a 20 MB
        --model-args) are kept as their size and digest, with a note; the command line has
        them, and a copy in every checkpoint would cost that much each time."""
        out = self.to_dict()
        for section, name in (("data", "dataset_args"), ("model", "model_args")):
            value = out[section][name]
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if len(text.encode()) > RECORDED_ARGS_LIMIT:
                digest = hashlib.sha256(text.encode()).hexdigest()
                out[section][name] = (f"<{len(text.encode())} bytes, sha256 {digest}: too long "
                                      "to copy into every checkpoint and log header; not stored>")
        return out

    # --- checking -----------------------------------------------------------------------------
    def _check_restarts(self) -> None:
        """--max-restarts: a replacement joins an async job through server 0 (ps/replacement.py);
        mpirun's recovery settings are the launch layer's check."""
        ps, restarts = self.ps, self.ps.max_restarts
        if not restarts:
            return
        _require(self.run.mode == "async", "--max-restarts", restarts,
                 "replacing a lost worker is for --mode async (a parameter server job under "
                 "mpirun's recovery settings); sync jobs use --elastic: drop --max-restarts "
                 "or add --mode async")
        _require(ps.num_servers == 1, "--max-restarts", restarts,
                 f"a replacement reaches the job through server 0 alone, and this job has "
                 f"--num-servers {ps.num_servers}: use --num-servers 1, or drop --max-restarts")
        _require(not ps.bsp, "--max-restarts", restarts,
                 "a replacement joins the job's batch plan, and --bsp rounds give each worker "
                 "a fixed share instead: drop --bsp (or --max-restarts)")

    def _check_balance_room(self) -> None:
        """--balance where its shares can move: a share's smallest size (rules/balance.py
        balance_settings) below --batch-size. The world size is the scheme's check."""
        r, s = self.run, self.sync
        if not s.balance:
            return
        _require(r.mode != "async", "--balance", s.balance,
                 "balancing is for --mode sync; async workers already take batches as "
                 "they are ready, a fast one more of them: drop --balance")
        from .rules.balance import balance_settings, least_share

        floor, _ = balance_settings(self)
        least = least_share(floor, s.backward_passes_per_step)
        if least >= r.batch_size:
            raise ConfigError(
                f"--balance: no share can move: every worker's share must be at least {least} "
                f"sample{'s' if least > 1 else ''} (--balance-floor {s.balance_floor:g} of --batch-size {r.batch_size}, "
                "and a sample per backward pass and pipeline micro-batch), which is all of "
                f"--batch-size {r.batch_size}; use a larger --batch-size (or fewer "
                "--backward-passes-per-step / --micro-batches), or drop --balance")

    def validate(self) -> "Config":
        """Raise :class:`ConfigError` for the first value that cannot work: each section checks
        its own fields, then the rules that span sections."""
        for section in (self.run, self.optim, self.data, self.model, self.sync, self.ps,
                        self.pipeline):
            section.validate()
            _require_finite(section)
        r, s, pl = self.run, self.sync, self.pipeline
        k = s.backward_passes_per_step
        _require(r.batch_size % k == 0, "--backward-passes-per-step", k,
                 f"it must divide --batch-size {r.batch_size} evenly "
                 f"({r.batch_size} % {k} = {r.batch_size % k}); change one of them")
        _require(not (self.ps.bsp and self.ps.dc_lambda), "--dc-lambda", self.ps.dc_lambda,
                 "delay compensation has nothing to correct under --bsp; drop one of them")
        _require(not (self.ps.bsp and self.ps.staleness_lr), "--staleness-lr", True,
                 "every gradient of a --bsp round is fresh, so there is nothing to scale; drop "
                 "one of them")
        if self.ps.backup_workers:
            _require(r.mode == "async" and self.ps.bsp, "--backup-workers", self.ps.backup_workers,
                     "backup workers close the lock-step rounds of the parameter server early; "
                     "add --mode async --bsp, or drop --backup-workers")
            # A late gradient is dropped and its worker continues from the parameters of its
            # reply, so every reply must carry them.
            _require(self.ps.pull_every == 1, "--pull-every", self.ps.pull_every,
                     "--backup-workers drops late gradients and sends their workers the new "
                     "parameters, which needs a pull with every push; use --pull-every 1")
        self._check_restarts()
        if s.elastic:
            _require(r.mode == "sync", "--elastic", s.elastic,
                     "elastic training is for --mode sync (an MPI job cannot change its ranks)")
            if not r.run_dir:
                raise ConfigError("--elastic needs --run-dir, a folder every host shares: if rank "
                                  "0 dies, the process that becomes rank 0 continues its log and "
                                  "checkpoints there")
        self._check_balance_room()
        if r.mode == "async":
            _require(not s.sync_batchnorm, "--sync-batchnorm", s.sync_batchnorm,
                     "SyncBatchNorm is a Horovod collective, for --mode sync; in async mode "
                     "every worker keeps its own BatchNorm statistics")
            _require(s.local_steps == 1, "--local-steps", s.local_steps,
                     "local SGD is for --mode sync; async workers already step apart (their "
                     "pulls are set by --pull-every); drop --local-steps or use --mode sync")
        per_pass = r.batch_size // k
        _require(pl.micro_batches <= per_pass, "--micro-batches", pl.micro_batches,
                 f"each backward pass sees --batch-size {r.batch_size} / "
                 f"--backward-passes-per-step {k} = {per_pass} "
                 f"samples, too few for {pl.micro_batches} micro-batches; use at most {per_pass}")
        return self


def parse_metric_goal(text: str) -> tuple[str, str] | None:
    """``"test_acc"`` -> ("test_acc", "max"); ``"test_loss"`` -> ("test_loss", "min"), as is any
    name that ends in loss; ``"min:test_mae"`` -> ("test_mae", "min"); ``""`` -> None."""
    text = (text or "").strip()
    if not text:
        return None
    goal, _, name = text.rpartition(":")
    name = name.strip()
    if goal.strip() not in ("", "max", "min") or not name:
        raise ValueError("name a metric such as test_acc or test_loss, optionally after max: "
                         "or min:, e.g. min:test_mae")
    return name, goal.strip() or ("min" if name.endswith("loss") else "max")


STOP_AT_FORMAT = "write NAME>=VALUE or NAME<=VALUE, e.g. test_acc>=0.95 or test_loss<=0.1"


def parse_stop_at(text: str) -> tuple[str, str, float] | None:
    """``"test_acc>=0.95"`` -> ("test_acc", ">=", 0.95); ``"test_loss <= 0.1"`` ->
    ("test_loss", "<=", 0.1); ``""`` -> None. Whether the run reports NAME is known only once
    its metrics are (loop/target.py)."""
    text = (text or "").strip()
    if not text:
        return None
    for op in (">=", "<="):
        name, found, value = text.partition(op)
        if found:
            break
    else:
        raise ValueError(STOP_AT_FORMAT)
    name = name.strip()
    try:
        target = float(value)
    except ValueError:
        raise ValueError(f"{value.strip()!r} is not a number; {STOP_AT_FORMAT}") from None
    if not name.isidentifier() or not math.isfinite(target):
        raise ValueError(STOP_AT_FORMAT)
    return name, op, target


def _require(ok: bool, flag: str, got: Any, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{flag}: invalid value {_show(got)}; {fix}")


def _require_finite(section: Any) -> None:
    """inf passes most range checks (inf >= 0) and then breaks the run; only the options marked
    infinite_ok (an unbounded --staleness) mean something by it."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value) and not (
                f.metadata.get("infinite_ok") and math.isinf(value)):
            _require(False, "--" + f.name.replace("_", "-"), value,
                     f"use a finite number, e.g. the default {f.default:g}")


def check_writable_folder(path: str, flag: str) -> None:
    """Fail at start-up, not at the first write, when ``path`` cannot become a folder that this
    process writes into: it (or what exists of it) is a regular file, or a folder without write
    permission."""
    existing = Path(path)
    while not os.path.exists(existing) and existing != existing.parent:
        existing = existing.parent  # the folder that would hold the new folders
    it = "it" if existing == Path(path) else str(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{flag} {path}: {it} is a file, not a folder; pass the path of a "
                          "folder (it is created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == Path(path) else ", where it would be created,"
        raise ConfigError(f"{flag} {path}: {it}{where} is not writable for this user; pass a "
                          "folder you can write to, or change its permissions")


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "(empty)"
    return repr(value)


def field_owners() -> dict[str, str]:
    """Map each option name to the section that holds it."""
    owners: dict[str, str] = {}
    for section, klass in SECTIONS.items():
        for f in dataclasses.fields(klass):
            assert f.name not in owners, f"option {f.name} defined twice"
            owners[f.name] = section
    return owners


def coerce(section: Any, name: str, value: Any) -> Any:
    """Turn a value from the command line or a config file into the field's type."""
    f = {f.name: f for f in dataclasses.fields(section)}[name]
    flag = "--" + name.replace("_", "-")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if value is None and default is not None:
        # fit(epochs=None), or a YAML null: the checks after this one compare numbers and would
        # raise a bare TypeError. None is a value only where it is the default (--run-dir).
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        kind = {bool: "True or False", int: "a whole number", float: "a number",
                tuple: "a list of whole numbers"}.get(type(default), "a string")
        raise ConfigError(f"{flag}: got None; give {kind} (the default is {shown!r}), or "
                          "leave the option out for its default")
    try:
        if value is None:
            out = None
        elif isinstance(default, bool):
            out = parse_bool(value)
        elif isinstance(default, tuple):
            out = parse_int_tuple(value)
        elif isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError("not a whole number")
            out = int(value)
        elif isinstance(default, float):
            out = float(value)
        elif isinstance(value, dict):  # --model-args as a TOML/YAML table
            out = json.dumps(value)
        else:
            out = str(value)
    except RecursionError:  # json.dumps of a table nested thousands deep; its repr would too
        raise ConfigError(too_deep(flag)) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{flag}: cannot read {value!r} ({e}); "
                          f"expected {type(default).__name__}") from None
    choices = f.metadata.get("choices")
    if choices and out not in choices:
        raise ConfigError(f"{flag}: invalid choice {out!r}; choose one of {', '.join(choices)}")
    return out


def too_deep(flag: str) -> str:
    """The message for a value nested deeper than Python's parsers and printers can recurse."""
    return (f"{flag}: the value is nested too deeply to read (more than about "
            f"{sys.getrecursionlimit()} levels of tables or brackets); pass a flat object of "
            "keyword arguments, e.g. {\"width\": 64}, and build deep structures in your own code")


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_int_tuple(value: Any) -> tuple[int, ...]:
    """``"1024,1024"``, ``"1x28x28"``, ``[256, 128]`` or ``64`` -> a tuple of ints."""
    if isinstance(value, (list, tuple)):
        parts = list(value)
    elif isinstance(value, int):
        parts = [value]
    else:
        parts = [p for p in str(value).replace("x", ",").split(",") if p.strip()]
    return tuple(int(p) for p in parts)


def load_config_file(path: str) -> dict[str, Any]:
    """Read a TOML or YAML file into flat option pairs.

    Keys may sit at the top level or under a section named like the dataclasses
    (``[optim]``, ``[run]``...). Dashes and underscores are interchangeable.
    """
    raw = _parse_config_text(path, _read_config_text(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a table of options, not {type(raw).__name__}")
    return _flat_options(raw, path)


def _read_config_text(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"--config: {path} is a folder; pass the path of a .toml or .yaml "
                          "file (a run folder's options are in the header of its metrics.jsonl)")
    if not p.is_file():
        raise ConfigError(f"--config: file {path} not found; pass the path of a .toml or .yaml file")
    try:
        return p.read_text(encoding="utf-8")  # TOML is UTF-8 by definition; YAML files in practice
    except UnicodeDecodeError as e:
        bad = e.object[e.start:e.start + 1]
        raise ConfigError(f"--config: {path} is not UTF-8 text (byte {e.start} is {bad!r}); "
                          "save it with UTF-8 encoding") from None
    except OSError as e:
        raise ConfigError(f"--config: cannot read {path} ({e.strerror}); check its "
                          "permissions") from None


def _parse_config_text(path: str, text: str) -> Any:
    """The file's content as TOML or YAML, by its suffix."""
    try:
        if Path(path).suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            return tomllib.loads(text)
        if Path(path).suffix in (".yaml", ".yml"):
            import yaml
            return yaml.safe_load(text) or {}
        raise ConfigError(f"--config: {path} must end in .toml, .yaml or .yml")
    except ConfigError:
        raise
    except RecursionError:  # tomllib and yaml parse nested tables recursively
        raise ConfigError(too_deep(f"--config: {path}")) from None
    except Exception as e:  # the parsers' own error types differ; all mean "fix the file"
        raise ConfigError(f"--config: cannot parse {path}: {e}") from None


def _flat_options(raw: dict, path: str) -> dict[str, Any]:
    """The file's options as flat pairs, each known and in its own section (or at the top)."""
    owners = field_owners()
    flat: dict[str, Any] = {}
    misplaced = []
    for key, value in raw.items():
        key = str(key).replace("-", "_")
        if key in SECTIONS and isinstance(value, dict):
            for sub, v in value.items():
                sub = str(sub).replace("-", "_")
                if owners.get(sub, key) != key:  # would silently apply elsewhere than it reads
                    misplaced.append(f"{sub} is under [{key}] but belongs in [{owners[sub]}]")
                flat[sub] = v
        else:
            flat[key] = value
    if misplaced:
        raise ConfigError(f"--config: {path}: {'; '.join(misplaced)}; move it to that section "
                          "(or to the top level)")
    unknown = sorted(k for k in flat if k not in owners)
    if unknown:
        raise ConfigError(f"--config: {path} has unknown option(s) {', '.join(unknown)}; "
                          f"valid options are: {', '.join(sorted(owners))}")
    return flat
