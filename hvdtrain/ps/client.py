"""The worker side of the parameter server: the async update scheme behind the shared trainer.

The replica's parameters are views into one contiguous float32 buffer, so a pull receives
straight into the model's weights; gradients are gathered into a second buffer of the same
layout and pushed shard by shard, chunk by chunk, with buffer-based (never pickled) MPI calls
(server_link.py). A server on the same host reads that gradient buffer in place and the worker
copies fresh parameters out of the server's shard, through an MPI shared-memory window
(``shared_memory.py``). The workers' own collectives (sums, stop votes, the lead's broadcasts)
are worker_group.py's, which the trainer reaches through async_group.py (the scheme's group);
the job's batches, slot_feed.py's.
"""

from __future__ import annotations

import time
from typing import Any

from ..config import Config
from ..layout import Topology
from ..replica import BatchStats, Replica
from ..runtime import Runtime
from ..scheme import UpdateScheme
from ..precision import PushGate
from ..rules.backup import check_backup_workers
from ..rules.clocks import IDLE_TO_EVERY_SERVER, IDLE_TO_LEADER
from ..rules.registry import server_rules
from .async_group import AsyncGroup, JobBatches
from .device_copies import copies_for
from .flat_parameters import FlatParameters
from .protocol import Kind
from .server_link import ServerLink, round_as_replies
from .slot_feed import SlotFeed, plan_message
from .stop_votes import StopVotes
from .survivors import Survivors
from .worker_group import WorkerGroup
from .worker_pauses import WorkerPauses


def _delegate(part: str, name: str) -> property:
    """An attribute of the client that lives in one of its parts (``link``, ``peers``)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class ParameterServerClient(UpdateScheme):
    """The async update scheme: push gradients to the servers, pull parameters back.

    What is trained: the parameters that require a gradient, of any floating dtype (float32 ones
    on the replica's first device live in the flat buffer; others, and those of pipeline stages
    on other devices, are copied out of it after each pull). A parameter that got no gradient in
    a step pushes zeros. Buffers (BatchNorm running statistics) are each worker's own: every
    worker starts from worker 0's, and the model that is evaluated and checkpointed carries
    worker 0's, which track its shard of the same data.

    Devices: the messages carry host memory (a server's shard may live on its GPU,
    --server-device, behind its own host copy: shard_device.py). A worker computes on its
    replica's device; device_copies.py moves the flat buffers between the two, and is the only
    part that differs between a CPU and a GPU worker.

    Mixed precision and clipping happen here, on the worker, before the push (precision.py):
    the worker unscales its gradient (fp16), clips it, and pushes it in float32, or skips the
    push when the loss scale overflowed. Clipping is the worker's job because each server holds
    only a shard of the gradient, so the whole gradient's norm would take another exchange per
    push, and because it bounds each worker's contribution the way clipping bounds a step in
    single-process training."""

    # A step pushes the gradient as backward leaves it, so a GPU worker copies it out during
    # backward (early_gradients.py); async DiLoCo pushes a round's difference instead.
    early_copies = True

    def __init__(self, cfg: Config, runtime: Runtime, comm, worker_comm, topology: Topology):
        from mpi4py import MPI

        self.MPI = MPI
        self.cfg = cfg
        self.runtime = runtime
        self.topology = topology
        self.pull_every = cfg.ps.pull_every
        self._waited = 0.0  # seconds the last step's push waited (take_wait_seconds)
        self.backup_workers = cfg.ps.backup_workers
        check_backup_workers(self.backup_workers, topology.num_workers)  # as the servers do
        self.started = False  # the servers have their INIT: other requests may follow
        self.clock = 0
        self.replica: Replica | None = None
        self.feed: SlotFeed | None = None  # the job's batches, handed out by server 0
        # Lost workers (survivors.py): their collectives move to a communicator of the others.
        self.survivors = Survivors(MPI, comm, worker_comm, topology.server_ranks()[0])
        self.peers = WorkerGroup(MPI, worker_comm, self.survivors, worker_comm.Get_rank(),
                                 cfg.ps.timeout_s)
        self.group, self.batches = AsyncGroup(self), JobBatches(self)
        # While it waits for a server under recovery: a frozen worker, lost meanwhile, may wake
        # after the job ended, and leaves when told so rather than time out (survivors.py).
        check_ended = self.survivors.check_ended if self.survivors.recovery else None
        self.link = ServerLink(MPI, comm, topology, worker_comm.Get_rank(), cfg.ps,
                               self.survivors.recovery, check_ended)
        self.stops = StopVotes(self.link, self.agree, self.going_idle, MPI.MAX)
        self.pauses = WorkerPauses(self.link, cfg.ps.eval_pauses_workers)

    # The names the trainer, the replacement (newcomer.py) and the benchmarks read and write.
    comm = _delegate("link", "comm")
    routes = _delegate("link", "routes")
    params_flat = _delegate("link", "params_flat")
    grads_flat = _delegate("link", "grads_flat")
    host = _delegate("link", "host")  # a replacement opens no window
    worker_rank = _delegate("link", "worker")  # a replacement takes a lost worker's number
    worker_comm = _delegate("peers", "comm")
    is_main = _delegate("peers", "is_main")  # the lead: after its loss, the lowest live worker

    @property
    def lr_scale(self) -> float:
        # The server's round policy says (rules/bsp.py, rules/ssp.py).
        num_workers = self.topology.num_workers
        return server_rules(self.cfg.ps, num_workers).policy.lr_scale(num_workers)

    # --- set-up --------------------------------------------------------------------------------
    def attach(self, replica: Replica) -> None:
        self.replica = replica
        self.flat = FlatParameters(replica.model)
        self.trained, total = self.flat.trained, self.flat.total
        self.copies = copies_for(replica.devices[0], total)
        self.flat.bind(self.copies.device_params)  # what the model computes with
        self.copies.parameters_to_host()
        # Whether the loss scale lets a step be pushed; built only for --precision fp16 or
        # --clip-grad-norm, as building a torch optimizer imports torch._dynamo (tens of MiB).
        self.gate: PushGate | None = None
        self.link.lay_out(self.copies, total)
        self.link.bind_gradients(self.copies.new_host_gradients(total), self.trained)
        self.early = None  # a GPU worker's hooks, for one backward pass a step
        if self.early_copies and replica.backward_passes == 1:
            self.early = self.copies.early_gradients(self.trained, self.link.grad_views,
                                                     self.link.chunks)

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """Collective over workers: worker 0 seeds the servers (its initial weights, or the
        checkpoint's weights and optimizer state) and the other workers' buffers; then every
        worker pulls."""
        total = self.params_flat.numel()
        server_state = state.get("server_state") if state else None
        headers = []
        if self.is_main and state is not None:
            self.replica.model.load_state_dict(state["model"])
            self.replica.precision.load_state_dict(state.get("grad_scaler"))  # worker 0's scale
            self.flat.copy_in()
            self.copies.parameters_to_host()
        buffers = self.worker_comm.bcast(
            {k: v.cpu() for k, v in self.replica.model.named_buffers()} if self.is_main else None,
            root=0)
        if not self.is_main:
            own = dict(self.replica.model.named_buffers())
            for name, value in buffers.items():
                own[name].copy_(value)
        if self.is_main:
            headers = self.link.announce(total, bool(server_state), plan=self.feed is not None)
        self.link.open_window(total, self.trained, self.cfg.ps.shared_memory)
        if self.is_main:
            self.MPI.Request.Waitall(headers)
            self.link.send_init_payload(server_state, self.group.checkpoint_place)
            if self.feed is not None:
                self.link.send_plan(plan_message(self.feed.queue.plan, state))
        self.pull()
        if resuming and not self.is_main and self.cfg.ps.bsp and round_as_replies(self.link):
            # At a checkpoint the lead's SAVE brought it the float32 master, and every other
            # worker held its round's reply, rounded to a 16-bit --wire-dtype: so it starts
            # again, or a resumed run would not end with the uninterrupted one's weights.
            self.flat.copy_out()
        self.started = True

    # --- the hot path --------------------------------------------------------------------------
    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        for p in self.trained:
            p.grad = None
        synchronized = self.replica.precision.needs_synchronized_gradients
        early = self.early if not synchronized else None  # fp16, clipping: after backward
        if early is not None:
            self.copies.begin_gradients(len(self.link.chunks))
            early.arm()
        stats = self.replica.forward_backward(x, y, grad_scale=1.0)
        finite = True
        if synchronized:
            if self.gate is None:
                self.gate = PushGate(self.trained)
            finite = self.replica.update(self.gate)  # unscale, clip; False: fp16 overflowed
        if finite and not (early is not None and early.finish()):
            self.flat.gather_gradients(self.link.grad_views)
            self.copies.gradients_to_host(self.link.chunks)
        started = time.perf_counter()  # the push and the reply: the wait for the servers
        self.push(lr, samples=stats.count,
                  want_params=self.clock % self.pull_every == self.pull_every - 1,
                  gradient=finite)
        self._waited = time.perf_counter() - started
        self.pauses.after_reply()  # --eval-pauses-workers: what an evaluation's pause costs
        self.stops.after_push()
        self._regroup()
        return stats

    def _regroup(self) -> bool:
        return self.peers.regroup()

    def take_wait_seconds(self) -> float:
        waited, self._waited = self._waited, 0.0
        return waited

    def push(self, lr: float, samples: int = 0, want_params: bool = True,
             gradient: bool = True) -> None:
        """Send the gradient buffer to the servers; with want_params, receive fresh parameters
        into the model's weights. Returns once the servers allow this worker to go on. Without
        a ``gradient`` (an fp16 step that overflowed) the push counts for the clocks and rounds
        but carries nothing to apply."""
        self.clock += 1
        self._exchange(Kind.PUSH, lr=lr, want_params=want_params, send_grads=gradient,
                       size=samples)

    def pull(self) -> None:
        self._exchange(Kind.PULL, lr=0.0, want_params=True, send_grads=False)

    def _exchange(self, kind: Kind, lr: float, want_params: bool, send_grads: bool,
                  size: int = 0) -> None:
        """One request to every server (server_link.py); the parameters that live outside the
        flat buffer are copied out of it after a pull."""
        header = {"clock": self.clock, "lr": lr, "size": size, "wants_stop": self.stops.wants}
        self.link.exchange(kind, header, want_params, send_grads,
                           self.feed.queue if self.feed else None)
        if want_params:
            self.flat.copy_out()

    # --- what the trainer needs besides steps ----------------------------------------------------
    def going_idle(self) -> None:
        """Before this worker waits for the others (a blocking collective of workers): tell the
        servers that its round policy says (idle_reports, rules/ssp.py and rules/bsp.py) not to
        count on it until its next push."""
        if not self.started:
            return
        policy = server_rules(self.cfg.ps, self.topology.num_workers).policy
        tell = policy.idle_reports(self.cfg.ps.eval_pauses_workers, self.survivors.recovery)
        if tell == IDLE_TO_EVERY_SERVER:
            self._tell_servers(Kind.IDLE)
        elif tell == IDLE_TO_LEADER:
            self.link.tell(Kind.IDLE, self.clock, leader_only=True)

    def agree(self, value: int, op, what: str) -> int:
        """One word agreed by every worker (worker_group.py), for the stop votes and the log's
        end (async_group.py)."""
        return self.peers.agree(value, op, what)

    def eval_replica(self, closing: bool = False) -> Replica:
        self.pull()  # score the servers' current parameters
        return self.replica

    def model_read_by_worker_0(self) -> None:
        """On the other workers, where worker 0 reads the model (its evaluation, a checkpoint):
        nothing to do here (asynchronous DiLoCo's rounds meet there under --bsp)."""

    def step_done(self, progress) -> None:
        self.pauses.step_done()

    def _tell_servers(self, kind: Kind) -> None:
        self.link.tell(kind, self.clock)

    def take_epoch_metrics(self) -> dict:
        # A GPU worker's copies (seconds and bytes); and, after a worker was lost, which: the
        # epoch line's sums are the survivors', so its samples leave out what the lost worker
        # trained in that epoch and never reported, and "workers" is the job's plan.
        lost = {"workers_lost": sorted(self.survivors.lost)} if self.survivors.lost else {}
        return {**self.copies.take_epoch_metrics(), **lost}

    def end_of_training(self) -> bool:
        return self.stops.end_of_training()

    def state_dict(self) -> dict[str, Any]:
        """Worker 0 has every server write its shard beside the checkpoint (ps/shard_file.py)
        and keeps their clocks and version; the model is its replica's, the servers'
        parameters of its last reply. Where that reply was a push's in a 16-bit --wire-dtype,
        rounded (an evaluation's pull is float32), the SAVE brings the float32 master copy, one
        transfer of the model, so that a checkpoint's model is never rounded. Others return
        {}."""
        if not self.is_main:
            return {}
        self.link.tell_place(self.group.checkpoint_place)  # read with the SAVE
        self._exchange(Kind.SAVE, lr=0.0, want_params=not self.link.wire.exact,
                       send_grads=False)
        server_state = self.link.receive_state()
        self._tell_servers(Kind.QUIET)  # the write follows: no hang however long it takes
        model_state = {k: v.clone() for k, v in self.replica.model.state_dict().items()}
        scale = self.replica.precision.state_dict()
        return {"model": model_state, **({"grad_scaler": scale} if scale is not None else {}),
                "server_state": server_state}

    def close(self) -> dict[str, Any] | None:
        """Tell the servers this worker is done; worker 0 collects their final statistics."""
        stats = self.link.say_done(self.clock, collect=self.is_main)
        self.survivors.poll()
        if not self.survivors.lost:  # a lost worker never joins the collective
            self.copies.release()  # the window's pages a GPU worker registered with CUDA
            self.host.close()  # collective with the servers, which close after the last DONE
        if not self.is_main:
            return None
        return job_statistics(stats)


def job_statistics(stats: list[dict]) -> dict[str, Any]:
    """What the run reports of the servers' final statistics (``stats``, one per server)."""
    # Every server sees every push (each holds a shard), so server 0's counts are the job's.
    return {"servers": stats, "staleness_histogram": stats[0]["staleness_histogram"],
            "pushes_applied": stats[0]["pushes_applied"],
            "pushes_made_by_workers": stats[0]["pushes_made_by_workers"],
            "samples": stats[0]["samples"],
            "samples_per_sec": stats[0]["samples_per_sec"],
            **{k: stats[0][k] for k in ("gradients_applied", "dropped_gradients",
                                        "pushes_without_gradient",
                                        "batches_completed", "batches_per_worker",
                                        "batches_left", "batches_handed_back",
                                        "workers_lost",
                                        "workers_replaced") if k in stats[0]}}
