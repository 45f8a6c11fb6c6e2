"""The combinations of options that span sections, checked once every section has checked its
own fields. A rule's own combinations are that rule's check, in its file under hvdtrain/rules/;
what stays here belongs to no single rule: the batch's divisions, elastic training, lost-worker
replacement and what async mode cannot run."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError, require
from .values import refuse_unread


def check_combinations(cfg: Any) -> None:
    """Raise ConfigError for the first combination of ``cfg`` (a whole.Config, typed loosely:
    whole.py imports this module) that cannot work, in the order a reader meets them: the
    batch, the server's rules, recovery, --balance, async, the pipeline."""
    from ..rules import backup, balance, dc_asgd, staleness_lr, wire_dtype

    r, s, pl = cfg.run, cfg.sync, cfg.pipeline
    _check_async_only(cfg)
    k = s.backward_passes_per_step
    require(r.batch_size % k == 0, "--backward-passes-per-step", k,
            f"it must divide --batch-size {r.batch_size} evenly "
            f"({r.batch_size} % {k} = {r.batch_size % k}); change one of them")
    dc_asgd.check_options(cfg)
    staleness_lr.check_options(cfg)
    backup.check_options(cfg)
    wire_dtype.check_options(cfg)
    if s.local_steps != 1 or s.outer_momentum_every or s.dynamic_local_steps:
        # async DiLoCo's combinations; its rule brings torch, so only where it may apply
        from ..rules.local_sgd import check_async_options
        check_async_options(cfg)
    _check_restarts(cfg)
    _check_elastic(cfg)
    o = cfg.optim  # the cosine decay starts once the warm-up ends: a run that ends first is flat
    require(o.lr_schedule != "cosine" or o.warmup_epochs < r.epochs, "--warmup-epochs",
            o.warmup_epochs, f"--lr-schedule cosine decays after the warm-up, which would last "
            f"all of --epochs {r.epochs}, so the rate would never decay; use --warmup-epochs "
            f"below {r.epochs} (0: none), or more --epochs")
    balance.check_room(cfg)
    _check_adasum(cfg)
    if r.mode == "async":
        _check_what_async_cannot_run(cfg)
    require(r.mode == "async" or cfg.ps.server_device == "cpu", "--server-device",
            cfg.ps.server_device, "only --mode async has parameter servers; drop "
            "--server-device (sync training computes on --device)")
    per_pass = r.batch_size // k
    require(pl.micro_batches <= per_pass, "--micro-batches", pl.micro_batches,
            f"each backward pass sees --batch-size {r.batch_size} / "
            f"--backward-passes-per-step {k} = {per_pass} "
            f"samples, too few for {pl.micro_batches} micro-batches; use at most {per_pass}")


def _check_what_async_cannot_run(cfg: Any) -> None:
    s, p = cfg.sync, cfg.ps
    require(not s.sync_batchnorm, "--sync-batchnorm", s.sync_batchnorm,
            "SyncBatchNorm is a Horovod collective, for --mode sync; in async mode "
            "every worker keeps its own BatchNorm statistics")
    require(s.collective == "horovod", "--collective", s.collective,
            "the parameter server talks MPI itself, with no collective backend; drop "
            "--collective (it is for --mode sync)")
    # What the server would ignore without a word: it pushes float32 unless --wire-dtype, and
    # lock-step rounds have no staleness to bound; the round weight is DiLoCo's.
    refuse_unread(s, ("compression",), False, "it compresses sync's gradient allreduce; the "
                  "parameter server's messages take --wire-dtype fp16 (or bf16) instead")
    refuse_unread(s, HOROVOD_ONLY, False, "an option of Horovod's allreduce (--mode sync); the "
                  "parameter server (--mode async) does not use Horovod and would ignore it: "
                  "drop {flag}")
    require(not p.bsp or math.isinf(p.staleness), "--staleness", p.staleness,
            "--bsp rounds are lock-step, with no staleness to bound; drop one of them")
    # A lock-step round replies with its new parameters, which a worker skipping pulls would
    # not take: it trained on parameters k rounds old while its log counted them fresh.
    require(not p.bsp or p.pull_every == 1, "--pull-every", p.pull_every,
            "--bsp rounds are lock-step: every worker takes each round's parameters with its "
            "reply, and pulling every k rounds would train on stale ones; use --pull-every 1, "
            "or drop --bsp")
    if not p.round_staleness_weight and s.local_steps == 1:
        raise ConfigError("--no-round-staleness-weight: the round weight is asynchronous "
                          "DiLoCo's (--local-steps H); drop it")


# What only Horovod reads: an async job has no allreduce (its chunks are --chunk-mb).
HOROVOD_ONLY = ("reduce_op", "fusion_threshold_mb", "cycle_time_ms")
# The parameter server's transport: what only an async job's messages read.
SERVER_TRANSPORT = ("chunk_mb", "shared_memory")
# The transports' tuning, which changes no result, that each mode does not read: compare gives
# a plan's --train-args of it to the modes that read it alone (compare/plan.py for_mode).
UNREAD_TUNING = {"sync": SERVER_TRANSPORT, "async": ("fusion_threshold_mb", "cycle_time_ms")}

# The parameter server's rules: what a sync run would ignore without a word, leaving its user
# to believe it ran SSP or BSP (mpirun -np 3 --staleness 0, --mode async forgotten, trained
# three sync workers). --backup-workers, --max-restarts and --server-device have checks of
# their own. Each mode has
# its own timeout for a hang, and a user who set the other mode's would believe a hang bounded.
# The transport's tuning (SERVER_TRANSPORT) changes no result, and is refused all the same: it
# would tune nothing (compare passes it only to the modes that read it: compare/plan.py).
ASYNC_RULES = ("num_servers", "staleness", "pull_every", "bsp", "dc_lambda", "staleness_lr",
               "round_staleness_weight", "eval_pauses_workers")


def _check_async_only(cfg: Any) -> None:
    mode = cfg.run.mode
    refuse_unread(cfg.ps, ASYNC_RULES, mode == "async",
                  f"an option of the parameter server (--mode async); this run is --mode {mode} "
                  "and would ignore it: add --mode async, or drop {flag}")
    refuse_unread(cfg.ps, SERVER_TRANSPORT, mode == "async",
                  "it tunes the parameter server's messages (--mode async); this run is --mode "
                  f"{mode}, whose allreduce takes --fusion-threshold-mb instead: drop {{flag}}")
    refuse_unread(cfg.ps, ("timeout_s",), mode == "async",
                  "the parameter server's limit on silence (--mode async); a sync run's hangs "
                  "are ended by --stall-timeout-s instead: use that")
    refuse_unread(cfg.sync, ("stall_timeout_s",), mode == "sync",
                  "sync's limit on a rank without progress; an async job's hangs are ended by "
                  "--timeout-s (seconds of silence from a process) instead: use that")


def _check_adasum(cfg: Any) -> None:
    """Adasum combines the gradients inside Horovod's optimizer step, so nothing can read the
    combined gradient before that step: a loss scale or a clip would act on each worker's own
    gradient instead of the combined one (Horovod itself stopped such a run at its first step)."""
    if cfg.sync.reduce_op != "adasum" or cfg.run.mode != "sync":
        return
    require(not cfg.sync.elastic, "--reduce-op", "adasum", "Horovod's elastic mode runs on "
            "Gloo, which has no Adasum (its first step failed); use --reduce-op average with "
            "--elastic, or drop --elastic")
    require(cfg.optim.clip_grad_norm <= 0, "--clip-grad-norm", cfg.optim.clip_grad_norm,
            "Adasum combines the gradients inside its optimizer step, so there is no combined "
            "gradient to clip; drop --clip-grad-norm or use --reduce-op average")
    require(cfg.run.precision != "fp16", "--precision", cfg.run.precision,
            "fp16's loss scale unscales the combined gradient, and Adasum combines inside its "
            "optimizer step; use --precision bf16 or 32, or --reduce-op average")


def _check_restarts(cfg: Any) -> None:
    """--max-restarts: a replacement joins an async job through server 0 (ps/replacement.py);
    mpirun's recovery settings are the launch layer's check."""
    ps, restarts = cfg.ps, cfg.ps.max_restarts
    if not restarts:
        return
    require(cfg.run.mode == "async", "--max-restarts", restarts,
            "replacing a lost worker is for --mode async (a parameter server job under "
            "mpirun's recovery settings); sync jobs use --elastic: drop --max-restarts "
            "or add --mode async")
    require(ps.num_servers == 1, "--max-restarts", restarts,
            f"a replacement reaches the job through server 0 alone, and this job has "
            f"--num-servers {ps.num_servers}: use --num-servers 1, or drop --max-restarts")
    require(not ps.bsp, "--max-restarts", restarts,
            "a replacement joins the job's batch plan, and --bsp rounds give each worker "
            "a fixed share instead: drop --bsp (or --max-restarts)")


def _check_elastic(cfg: Any) -> None:
    """Horovod's elastic mode: sync only, and a shared folder for the rank that takes over."""
    if not cfg.sync.elastic:
        return
    require(cfg.run.mode == "sync", "--elastic", cfg.sync.elastic,
            "elastic training is for --mode sync (an MPI job cannot change its ranks)")
    if not cfg.run.run_dir:
        raise ConfigError("--elastic needs --run-dir, a folder every host shares: if rank "
                          "0 dies, the process that becomes rank 0 continues its log and "
                          "checkpoints there")
