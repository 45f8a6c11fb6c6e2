"""The world's arithmetic in one place: how many processes serve and how many train, and which
devices this rank's pipeline stages take. Built once from the config and the world, before any
rank communicates, so an impossible topology fails on every rank alike with the numbers in its
message (compare torchtitan's ParallelDims). The layer split itself is pipeline.balanced_bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import Config, ConfigError
from .rules.backup import check_backup_workers


@dataclass(frozen=True)
class Topology:
    """Which ranks serve and which train, in an async job: with N processes and S servers,
    ranks 0..N-S-1 are workers and the last S ranks are servers, so rank 0 is worker 0, the
    process that logs and checkpoints. An impossible split fails on construction."""

    world_size: int
    num_servers: int

    def __post_init__(self):
        if self.num_servers < 1:
            raise ConfigError(f"--num-servers: invalid value {self.num_servers}; "
                              "use at least 1 server")
        if self.num_servers >= self.world_size:
            raise ConfigError(
                f"--num-servers {self.num_servers} with {self.world_size} process(es) leaves "
                f"{self.world_size} - {self.num_servers} = {self.world_size - self.num_servers} "
                f"workers; async mode needs at least one worker: launch at least "
                f"{self.num_servers + 1} processes (mpirun -np {self.num_servers + 1} ...) or "
                "lower --num-servers")

    @property
    def num_workers(self) -> int:
        return self.world_size - self.num_servers

    def is_server(self, rank: int) -> bool:
        return rank >= self.num_workers

    def server_ranks(self) -> list[int]:
        return list(range(self.num_workers, self.world_size))

    def worker_ranks(self) -> list[int]:
        return list(range(self.num_workers))

    def server_index(self, rank: int) -> int:
        return rank - self.num_workers


@dataclass(frozen=True)
class Layout:
    world_size: int
    topology: Topology | None       # the parameter servers' rank layout; None in sync mode
    stage_devices: tuple[str, ...]  # this rank's pipeline stages, in order; () without a split

    @staticmethod
    def job_topology(cfg: Config, world_size: int) -> Topology | None:
        """The job's rank layout, None in sync mode (every process trains). Checked here, on
        every rank alike, before a server and a worker disagree over MPI."""
        if cfg.run.mode != "async":
            return None
        topology = Topology(world_size, cfg.ps.num_servers)  # at least one worker is left
        check_backup_workers(cfg.ps.backup_workers, topology.num_workers)
        return topology

    @classmethod
    def build(cls, cfg: Config, world_size: int, local_rank: int, local_size: int,
              gpu_count: int | None = None) -> "Layout":
        topology = cls.job_topology(cfg, world_size)
        devices: tuple[str, ...] = ()
        if cfg.pipeline.stages > 1:
            if gpu_count is None:
                gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            devices = tuple(assign_devices(cfg.pipeline.devices, cfg.pipeline.stages, local_rank,
                                           local_size, gpu_count))
        return cls(world_size, topology, devices)

    @property
    def num_servers(self) -> int:
        """0 in sync mode: every process trains."""
        return self.topology.num_servers if self.topology else 0


def assign_devices(spec: str, stages: int, local_rank: int, local_size: int,
                   gpu_count: int) -> list[str]:
    """The devices of this rank's stages. The same checks run on every rank, for every rank of
    the host, so a topology that cannot work fails everywhere alike before training starts."""
    entries = [e.strip() for e in spec.split(",") if e.strip()] or ["auto"]
    if entries == ["auto"]:
        entries = ["cuda" if gpu_count else "cpu"]
    if len(entries) == 1:
        entries = entries * stages
    if len(entries) == stages * local_size and local_size > 1:
        mine = entries[local_rank * stages:(local_rank + 1) * stages]
        host = [entries[r * stages:(r + 1) * stages] for r in range(local_size)]
    elif len(entries) == stages:
        mine, host = entries, [entries] * local_size
    else:
        raise ConfigError(
            f"--devices {spec}: give one device per stage ({stages}), or one per stage of every "
            f"rank on this host ({local_size} ranks x {stages} stages = {stages * local_size})")
    resolved = [[_resolve(e, r, k, stages, spec) for k, e in enumerate(devs)]
                for r, devs in enumerate(host)]
    gpus = [d for devs in resolved for d in devs if d.startswith("cuda")]
    for d in gpus:
        if int(d.split(":")[1]) >= gpu_count:
            raise ConfigError(
                f"--devices {spec}: {local_size} rank(s) on this host x {stages} stages need "
                f"{d}, but this host has {gpu_count} GPU(s); use fewer stages or ranks per "
                f"host, or --devices cpu")
    if len(set(gpus)) < len(gpus):
        clash = sorted({d for d in gpus if gpus.count(d) > 1})
        raise ConfigError(
            f"--devices {spec}: {', '.join(clash)} would hold more than one stage on this host "
            f"({local_size} rank(s) x {stages} stages); give --devices cuda (rank r takes "
            f"cuda:r*{stages}+k) or list {stages * local_size} distinct devices")
    return resolved[local_rank % local_size] if local_size else resolved[0]


def _resolve(entry: str, local_rank: int, stage: int, stages: int, spec: str) -> str:
    if entry == "cpu":
        return "cpu"
    if entry == "cuda":
        return f"cuda:{local_rank * stages + stage}"
    if entry.startswith("cuda:") and entry[5:].isdigit():
        return entry
    raise ConfigError(f"--devices {spec}: unknown device {entry!r}; use cpu, cuda or cuda:N")
