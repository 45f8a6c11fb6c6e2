"""The options of --mode async: the parameter server, its rules and its transport."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import require
from .values import MIN_CHUNK_MB, opt


@dataclass
class PSConfig:
    """Parameter-server settings for --mode async (launch with mpirun: S servers + N-S workers)."""

    num_servers: int = opt(1, "server processes; the last S ranks serve, the others train")
    staleness: float = opt(math.inf, "SSP bound: no worker may be more than this many pushes "
                           "ahead of the slowest; 0 is lock-step, inf (as in MXNet "
                           "dist_async) fully asynchronous; see docs/async.md",
                           infinite_ok=True)
    pull_every: int = opt(1, "pull fresh parameters after every k-th push")
    bsp: bool = opt(False, "lock-step averaging through the server: each round's gradients "
                    "are averaged and applied once, like sync training")
    backup_workers: int = opt(0, "--bsp with b backup workers (Chen et al. 2016): each round "
                              "applies the first N-b gradients and drops the later ones; the "
                              "learning rate scales by N-b. 0: plain --bsp; see docs/async.md")
    dc_lambda: float = opt(0.0, "delay compensation (DC-ASGD, Zheng et al. 2017): "
                           "g + lambda*g*g*(w_now - w_pulled); 0 disables, ~0.04 is typical")
    staleness_lr: bool = opt(False, "staleness-aware learning rate (Zhang et al. 2016): the "
                             "server scales the step of a gradient computed s updates ago by "
                             "1/max(1, s)")
    round_staleness_weight: bool = opt(True, "--mode async --local-steps H (asynchronous "
                                       "DiLoCo): the server steps with each pushed round "
                                       "weighted by 1/max(1, min(s, N-1)), s the pushes applied "
                                       "since its worker's pull and N the workers, so that N "
                                       "workers' rounds move the model about as far together as "
                                       "one round of sync DiLoCo; with 2 workers no round is "
                                       "weighted. --no-round-staleness-weight applies every "
                                       "round whole, which diverged with 4 or more workers; "
                                       "--staleness-lr weighs by 1/max(1, s) instead. See "
                                       "docs/async.md")
    eval_pauses_workers: bool = opt(False, "while worker 0 evaluates, no other worker trains, "
                                    "as in sync mode, so that a time to target counts no free "
                                    "steps; hvdtrain compare turns it on; see docs/async.md")
    chunk_mb: float = opt(1.0, "gradient and parameter messages travel in chunks of this many "
                          "MiB, so the server updates one chunk while the next is in flight")
    wire_dtype: str = opt("fp32", "what travels between hosts: the gradients a worker pushes "
                          "and the parameters a push's reply brings back, and in --mode sync "
                          "what local SGD's and DiLoCo's rounds average (--local-steps H). "
                          "bf16 or fp16 halve the bytes; the server's master copy and "
                          "optimizer state, checkpoints and the shared-memory window stay "
                          "float32. Plain sync's gradient allreduce has --compression instead. "
                          "See docs/async.md", choices=("fp32", "bf16", "fp16"))
    timeout_s: float = opt(300.0, "seconds of silence from a process (a worker that sends "
                           "nothing while the others train, servers that send no reply, "
                           "workers that never reach the end) before the job is declared "
                           "stuck and ended with an error (0: wait forever); a slow worker is "
                           "never silent: each of its steps is a message")
    max_restarts: int = opt(0, "replace up to this many lost workers with new processes "
                            "(MPI_Comm_spawn from server 0), which pull the current "
                            "parameters and train on; needs mpirun's recovery settings and "
                            "--num-servers 1; see docs/async.md")
    shared_memory: bool = opt(True, "between a server and the workers on its host, keep "
                              "gradients and parameters in an MPI shared-memory window instead "
                              "of copying them through messages")
    server_device: str = opt("cpu", "where each server holds its shard of the parameters and "
                             "the optimizer state, and applies the pushes: cpu, cuda (the "
                             "server rank's GPU; refused where that rank has none) or auto (a "
                             "GPU where there is one). Messages still move host memory; "
                             "checkpoints hold CPU tensors either way. See docs/gpu.md",
                             choices=("cpu", "cuda", "auto"))

    def validate(self) -> None:
        p = self
        require(p.num_servers >= 1, "--num-servers", p.num_servers, "use at least 1 server")
        whole = math.isinf(p.staleness) or float(p.staleness).is_integer()
        require(p.staleness >= 0 and whole, "--staleness", p.staleness, "use 0 (lock-step), a whole number of pushes such "
                "as 4, or inf (fully asynchronous)")
        require(p.pull_every >= 1, "--pull-every", p.pull_every, "pull every k >= 1 pushes")
        require(p.dc_lambda >= 0, "--dc-lambda", p.dc_lambda, "use 0 (off) or a small positive "
                "value such as 0.04")
        # A message per few parameters: 1e-7 (one float per message) looked like a hang.
        require(p.chunk_mb >= MIN_CHUNK_MB, "--chunk-mb", p.chunk_mb,
                f"use a size in MiB of at least {MIN_CHUNK_MB:g} (smaller chunks only add "
                "per-message overhead), e.g. 1")
        require(p.timeout_s >= 0, "--timeout-s", p.timeout_s, "use 0 (wait forever) or seconds")
        require(p.max_restarts >= 0, "--max-restarts", p.max_restarts,
                "use 0 (no replacement) or the number of lost workers to replace, e.g. 1")
        require(p.backup_workers >= 0, "--backup-workers", p.backup_workers,
                "use 0 (plain --bsp) or a positive number below the number of workers, "
                "e.g. 1")
