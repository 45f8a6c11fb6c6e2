"""--profile-steps A:B: torch.profiler over a window of this process's steps, a step hook.

Where a run is slower than a hand-written loop, the question is what each step waits for: more
operators (on a GPU, more kernel launches), a synchronization with the GPU that the loop does
not need, a copy, or Python between the operators. torch.profiler answers it; this hook runs it
over steps A to B (counted from 1 by each worker process from its start, a resume counting
afresh), where step 1's one-off costs (allocation, autotuning, the first collective) are past,
and writes two files per worker into the run folder:

    profile-rank<R>-steps<A>-<B>.txt    a summary per step, then torch's table of operators
    profile-rank<R>-steps<A>-<B>.json   the timeline, for chrome://tracing or Perfetto

(-2.txt, -3.txt... where a resume profiled the same window before: no profile replaces
another). The profiler starts after step A - 1 and stops after step B, so the window holds
B - A + 1 whole step periods, the loop's own work between steps included. Outside it the hook
costs one comparison a step. A run that ends inside the window writes the steps it recorded."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from ..config.values import parse_profile_steps
from .hooks import StepHook, StepResult

# CUDA runtime and driver calls, as the profiler names them on the CPU side
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SYNCHRONIZATIONS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPIES = ("cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2DAsync")
TABLE_ROWS = 30


def profile_window(run, folder: Callable[[], Path], runtime) -> list[StepHook]:
    """The trainer's hook for --profile-steps (none without it). ``run``: the RunConfig;
    ``runtime``: the process's rank and device."""
    if not run.profile_steps:
        return []
    return [ProfileWindow(run.profile_steps, folder, runtime.rank, runtime.device.type == "cuda")]


class ProfileWindow(StepHook):
    """The hook (module docstring). ``folder``: the run folder, asked when the files are written
    (the run claims it after the hooks are made); ``rank``: the process's rank, in the files'
    names; ``cuda``: also record the GPU's activity; ``who``: the loop profiled, in the text
    (scripts/gpu/hand_loop.py profiles its own steps with this hook)."""

    def __init__(self, spec: str, folder: Callable[[], Path], rank: int, cuda: bool,
                 who: str = "hvdtrain"):
        self.first, self.last = parse_profile_steps(spec)
        self.folder, self.rank, self.cuda, self.who = folder, rank, cuda, who
        self.steps = 0
        self.profiler = None
        self.started = 0.0
        self.written: Path | None = None  # the summary's path, once written

    def after_step(self, step: StepResult) -> None:
        self.steps += 1
        if self.steps == self.first - 1:
            self._guarded(self._start)
        elif self.steps == self.last and self.profiler is not None:
            self.close()

    def close(self) -> None:
        """Stop and write, if the window is open (also where a run ends inside it); where the
        run ended before the window, say so (it had ended without a word)."""
        if self.profiler is not None:
            self._guarded(self._write)
        elif self.written is None and self.steps < self.first and self.rank == 0:
            print(f"{self.who}: --profile-steps {self.first}:{self.last}: this process took "
                  f"{self.steps} steps, so nothing was profiled; choose a window within the run "
                  "(steps counted from the process's start, a resume counting afresh)",
                  flush=True)

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.profiler = profile(activities=activities)
        self.profiler.start()
        self.started = time.perf_counter()

    def _write(self) -> None:
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        steps = self.steps - (self.first - 1)
        seconds = time.perf_counter() - self.started
        summary = summarize(profiler, steps, seconds, self.cuda)
        name = f"profile-rank{self.rank}-steps{self.first}-{self.first + steps - 1}"
        self.written = _fresh_file(self.folder(), name, f"{self.who} profile: rank {self.rank}, "
                                   + summary)
        profiler.export_chrome_trace(str(self.written.with_suffix(".json")))
        if self.rank == 0:  # each worker writes its own; one line says where
            print(f"{self.who}: profile of {steps} steps written to {self.written} (and the "
                  f"timeline beside it, .json); every worker wrote its own", flush=True)

    def _guarded(self, action: Callable[[], None]) -> None:
        """A profiler that cannot start or write (no CUPTI, a full disk) costs the run its
        profile, not its training: it says so and training goes on."""
        try:
            action()
        except Exception as e:  # noqa: BLE001 - whatever the profiler raises
            self.profiler = None
            print(f"hvdtrain: --profile-steps: profiling failed on rank {self.rank} "
                  f"({type(e).__name__}: {e}); training goes on without it", file=sys.stderr)


def _fresh_file(folder: Path, name: str, text: str) -> Path:
    """Write ``text`` to ``folder/name.txt``, or to ``name-2.txt``... where an earlier process
    of the run (a resume with the same window) wrote one: a profile never replaces another."""
    n = 1
    while True:
        path = folder / (f"{name}.txt" if n == 1 else f"{name}-{n}.txt")
        try:
            with open(path, "x") as f:
                f.write(text)
            return path
        except FileExistsError:
            n += 1


def summarize(profiler, steps: int, seconds: float, cuda: bool) -> str:
    """The window's figures per step, then torch's table of operators by their own CPU time
    (and, with the GPU, by their own GPU time). ``profiler``: a stopped torch.profiler.profile;
    ``seconds``: the window's wall time."""
    from torch.autograd import DeviceType
    events = profiler.events()
    averages = profiler.key_averages()
    calls = {row.key: row.count for row in averages}
    lines = [f"steps {steps}: {1e3 * seconds / steps:.3f} ms a step (wall)",
             f"per step: {_top_level_operators(events) / steps:.1f} operators (torch's, outside "
             "other operators)"]
    if cuda:
        busy_us = sum(e.time_range.elapsed_us() for e in events
                      if getattr(e, "device_type", None) == DeviceType.CUDA)
        per_step = {name: sum(calls.get(call, 0) for call in group) / steps
                    for name, group in (("kernel launches", LAUNCHES),
                                        ("synchronizations with the GPU", SYNCHRONIZATIONS),
                                        ("copies", COPIES))}
        lines.append("per step on the GPU: " + ", ".join(f"{v:.1f} {k}"
                                                          for k, v in per_step.items()))
        lines.append(f"GPU busy {busy_us / 1e3 / steps:.3f} ms a step "
                     f"({busy_us / 1e4 / seconds:.0f}% of the wall time; kernels and copies)")
    lines += ["", "operators by their own CPU time:",
              averages.table(sort_by="self_cpu_time_total", row_limit=TABLE_ROWS)]
    if cuda:
        lines += ["operators by their own GPU time:",
                  averages.table(sort_by="self_device_time_total", row_limit=TABLE_ROWS)]
    return "\n".join(lines) + "\n"


def _top_level_operators(events) -> int:
    """torch operators (aten::) called from outside any other: what the loop dispatched."""
    count = 0
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        count += parent is None
    return count
