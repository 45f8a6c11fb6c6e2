"""The options of --mode sync: Horovod's settings, local SGD and DiLoCo, elastic training and
--balance. The combinations a rule cannot run are that rule's check (rules/local_sgd.py,
rules/balance.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, require
from .values import MAX_CYCLE_TIME_MS, opt, refuse_unread

AUTO_LOCAL_STEPS = 8  # --local-steps auto: the fastest worker's H, as in the adiloco8 mode


def expand_local_steps(values: dict) -> dict:
    """``--local-steps auto`` or ``auto:H`` (asynchronous DiLoCo's Dynamic Local Updates, Liu et
    al. 2024) as the two options it stands for: H for the fastest worker (8 unless given) and
    --dynamic-local-steps. Any other value passes through to the whole-number check."""
    given = values.get("local_steps")
    if not (isinstance(given, str) and given.strip().lower().startswith("auto")):
        return values
    word, colon, base = given.strip().lower().partition(":")
    if word != "auto" or (colon and not base.isdigit()):
        raise ConfigError(f"--local-steps: invalid value {given!r}; use a whole number of "
                          "steps, 'auto' (each async worker's H follows its speed, the "
                          f"fastest's {AUTO_LOCAL_STEPS}) or 'auto:H', e.g. auto:16")
    return {**values, "local_steps": int(base) if base else AUTO_LOCAL_STEPS,
            "dynamic_local_steps": True}


@dataclass
class SyncConfig:
    """Horovod settings for --mode sync."""

    collective: str = opt("horovod", "the collective backend of --mode sync: horovod, or torch "
                          "(torch.distributed: Gloo on CPUs, NCCL on GPUs; launched by mpirun, "
                          "horovodrun --gloo or torchrun), which runs the same sync, local SGD "
                          "and DiLoCo and refuses Horovod's own features (--reduce-op adasum, "
                          "--elastic, --sync-batchnorm, --balance, --cycle-time-ms). See "
                          "docs/sync.md",
                          choices=("horovod", "torch"))
    compression: str = opt("none", "gradient compression on the wire: none or fp16",
                           choices=("none", "fp16"))
    reduce_op: str = opt("average", "how gradients combine: average, or adasum "
                         "(Maleki et al. 2020; the learning rate is then not scaled on CPU)",
                         choices=("average", "adasum"))
    backward_passes_per_step: int = opt(1, "gradient accumulation: split each per-worker "
                                        "batch into this many backward passes before one "
                                        "allreduce and update")
    local_steps: int = opt(1, "local SGD (Lin et al. 2020; with --mode async, asynchronous "
                           "local SGD / DiLoCo through the server, docs/async.md, where 'auto' "
                           "or 'auto:H' is --dynamic-local-steps with H, by default "
                           f"{AUTO_LOCAL_STEPS}, for the fastest worker): each worker "
                           "takes this many "
                           "optimizer steps on its own gradients, then the workers average "
                           "their parameters and BatchNorm statistics; 1 averages the gradient "
                           "of every step (plain sync). The optimizer state (momentum, Adam "
                           "moments) stays local between rounds and is averaged only at epoch "
                           "ends and checkpoints, where the model is also averaged whatever "
                           "the step count; --clip-grad-norm and the fp16 loss scale then "
                           "apply to each worker's own gradient")
    outer_lr: float = opt(0.0, "DiLoCo (Douillard et al. 2023) on top of --local-steps H: "
                          "every H steps the workers average how far their inner steps moved "
                          "them (the round's start minus their parameters), and an outer SGD "
                          "with this learning rate (and --outer-momentum, Nesterov) steps the "
                          "round's start with it; 0.7 in the paper. 0: plain local SGD, the "
                          "parameters averaged. The outer step multiplies a round's progress "
                          "by LR / (1 - M) once its momentum has built up (async, with "
                          "Delayed Nesterov's N: LR (1 + M / (N (1 - M)))), so the workers' "
                          "rate (--lr times N under --lr-scaling linear) is divided by that. "
                          "The outer momentum is checkpointed")
    outer_momentum: float = opt(0.0, "--outer-lr: Nesterov momentum of the outer SGD, in "
                                "[0, 1); 0.9 in the paper. 0: plain outer SGD")
    outer_momentum_every: int = opt(0, "--mode async --local-steps H (asynchronous DiLoCo): "
                                    "Delayed Nesterov (Liu et al. 2024): the server updates "
                                    "the outer momentum once every N pushes, with the mean of "
                                    "the N pseudo-gradients, and applies the pushes in between "
                                    "as plain outer SGD steps; 1: plain Nesterov on every push "
                                    "(which diverged on digits); 0: the default, 4. See "
                                    "docs/async.md")
    dynamic_local_steps: bool = opt(False, "--mode async --local-steps H: Dynamic Local "
                                    "Updates (Liu et al. 2024): the fastest worker takes H "
                                    "inner steps per round and every other worker a share of H "
                                    "in proportion to its measured speed (at least 1), so that "
                                    "rounds take about as long; each push tells server 0 its "
                                    "worker's time per step and learns the fastest's, so no "
                                    "worker waits for another. See docs/async.md")
    fusion_threshold_mb: float = opt(64.0, "Horovod tensor fusion buffer in MiB "
                                     "(HOROVOD_FUSION_THRESHOLD); 0 disables fusion")
    elastic: bool = opt(False, "Horovod elastic training: survive lost workers and take in new "
                        "ones (launch with horovodrun --gloo --min-np/--max-np "
                        "--host-discovery-script)")
    elastic_commit_steps: int = opt(50, "--elastic: commit the model, optimizer and progress "
                                    "every N steps (and at each epoch's end); a reset redoes at "
                                    "most this many steps")
    sync_batchnorm: bool = opt(False, "turn the model's BatchNorm layers into Horovod's "
                               "SyncBatchNorm, so batch statistics cover the global batch")
    balance: bool = opt(False, "batch shares that follow measured speed: the global batch "
                        "(--batch-size x workers) stays fixed, and at each epoch's end every "
                        "worker's share of it for the next epoch is re-planned in proportion to "
                        "its measured throughput (samples per second of compute), so a slow "
                        "worker trains fewer samples per step instead of holding the others "
                        "up. Gradients are weighted by the shares: the update is the global "
                        "batch's, as with equal shares. See docs/sync.md")
    balance_floor: float = opt(0.25, "--balance: the smallest share, as a fraction of the "
                               "equal share --batch-size (rounded up to whole multiples of "
                               "--backward-passes-per-step); keeps a slow worker in every step, "
                               "so its speed is still measured and a recovered one regains its "
                               "share")
    balance_damping: float = opt(0.5, "--balance: how far each re-plan moves the shares toward "
                                 "the measured speeds, in (0, 1]; 1 all the way, less to keep "
                                 "them from swinging where step times are noisy")
    stall_timeout_s: float = opt(300.0, "a rank that makes no progress (no step, evaluation "
                                 "or checkpoint) for this many seconds ends the job with an "
                                 "error naming the rank that stopped, instead of hanging; make "
                                 "it longer than your slowest step, evaluation or checkpoint "
                                 "write (0: never). Also Horovod's own stall check")
    cycle_time_ms: float = opt(0.0, "Horovod background cycle time in ms (HOROVOD_CYCLE_TIME). "
                               "0: chosen for you, 10 where Horovod starts each collective as "
                               "it is enqueued (hvdtrain's Horovod build, on CPUs), so the "
                               "cycle only paces Horovod's idle negotiation, else Horovod's 1 "
                               "(see docs/sync.md)")

    def validate(self) -> None:
        s = self
        require(s.backward_passes_per_step >= 1, "--backward-passes-per-step",
                s.backward_passes_per_step, "use 1 (no accumulation) or more")
        require(s.fusion_threshold_mb >= 0, "--fusion-threshold-mb", s.fusion_threshold_mb,
                "use 0 (no fusion) or a size in MiB, e.g. 64")
        # Every allreduce waits up to a cycle: 1e7 ms looked like a hang with no word.
        require(0 <= s.cycle_time_ms <= MAX_CYCLE_TIME_MS, "--cycle-time-ms", s.cycle_time_ms,
                f"use 0 (chosen for you) or a time in ms, at most {MAX_CYCLE_TIME_MS:g}, e.g. 1")
        require(s.elastic_commit_steps >= 1, "--elastic-commit-steps", s.elastic_commit_steps,
                "commit every N >= 1 steps, e.g. 50")
        refuse_unread(s, ("elastic_commit_steps",), s.elastic, "it paces --elastic's commits, "
                      "and this run is not elastic: add --elastic, or drop {flag}")
        require(s.stall_timeout_s >= 0, "--stall-timeout-s", s.stall_timeout_s,
                "use 0 (no stall check) or seconds, e.g. 300")
        require(s.local_steps >= 1, "--local-steps", s.local_steps,
                "use 1 (average every step's gradient) or more steps between parameter "
                "averages, e.g. 4")
        if s.collective == "torch":
            s._check_torch_collective()
        if s.local_steps > 1 or s.outer_lr or s.outer_momentum:
            # Only a local SGD run pays for importing its rule (which brings torch).
            from ..rules.local_sgd import check_sync_options
            check_sync_options(s)
        from ..rules.balance import check_sync_options as check_balance
        check_balance(s)

    def _check_torch_collective(self) -> None:
        """What --collective torch does not do (sync/torch_collective.py), and what instead."""
        for refused, why in (
                (self.reduce_op == "adasum", "--reduce-op adasum is Horovod's; use --collective "
                                             "horovod, or --reduce-op average"),
                (self.elastic, "--elastic is Horovod's elastic mode; use --collective horovod "
                               "under horovodrun's elastic mode, or drop --elastic"),
                (self.sync_batchnorm, "--sync-batchnorm uses Horovod's SyncBatchNorm; use "
                                      "--collective horovod, or drop --sync-batchnorm"),
                (self.cycle_time_ms != 0, "--cycle-time-ms tunes Horovod's background thread, "
                                          "which --collective torch does not start; drop it"),
                (self.balance, "--balance runs on Horovod's scheme (sync/shares.py); use "
                               "--collective horovod, or drop --balance")):
            if refused:
                raise ConfigError(f"--collective torch: {why}")
