"""--async-checkpoint: write checkpoints in a background thread, so that a step waits only for a
copy of the state in CPU memory, not for torch.save, fsync and the rename.

The copy is what makes it safe: the model and the optimizer change at the next step, so every
tensor of the state is cloned (GPU tensors into CPU memory) before save() returns. The thread
then writes the copy with checkpoint.save_atomic, as a synchronous save does: a temporary file
in the same folder, fsync, rename, fsync of the folder. A process killed during the write
(kill -9, a lost node) leaves the previous checkpoint intact, and a stale temporary file that the
next run's start removes (checkpoint.remove_stale_temporaries).

One write at a time, in order: a save while one is in flight waits for it before it copies
(never skips, so each checkpoint the cadence promises is written, and a resume point is always
the newest complete one). The thread's error (a full disk) is raised in the training thread by
the next save, or by wait() where the run ends, stops or reports; it is never lost.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from ..checkpoint import map_tensors


class StateCopy:
    """Copies of a state's tensors in CPU memory, in buffers kept from one save to the next:
    the first save allocates them, later ones copy into them (new memory costs a page fault per
    4 KiB page on first touch, which made a fresh copy several times slower than the copy
    itself). Reusing them is safe because a save copies only after the write before it is
    done. The price: one copy of the state stays in CPU memory for the run (pinned for a GPU
    model, so that the copy from the device runs at full speed)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.from_gpu = False  # a tensor came from a GPU: wait for its copy before writing

    def __call__(self, obj: Any) -> Any:
        """``obj`` with every tensor copied (tied weights stay one tensor); containers rebuilt;
        other values shared (the state's plain values are numbers, strings and fresh dicts,
        never changed in place)."""
        return map_tensors(obj, self._buffer)

    def _buffer(self, tensor: torch.Tensor, key: tuple) -> torch.Tensor:
        tensor = tensor.detach()
        self.from_gpu = self.from_gpu or tensor.device.type == "cuda"
        buffer = self.buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                                 pin_memory=tensor.device.type == "cuda")
            self.buffers[key] = buffer
        buffer.copy_(tensor, non_blocking=tensor.device.type == "cuda")
        return buffer


def cpu_copy(obj: Any) -> Any:
    """``obj`` with every tensor copied into new CPU memory (StateCopy without kept buffers)."""
    return StateCopy()(obj)


class CheckpointWriter:
    """The background writer. ``submit(state, write)`` copies ``state`` to the CPU and runs
    ``write(copy)`` in a thread; ``wait()`` returns once it is done, raising its error."""

    SLOW_NOTE_SECONDS = 1.0  # a save that waits longer than this for the previous write says so

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._noted_slow = False
        self.copy = StateCopy()

    def submit(self, state: dict[str, Any], write: Callable[[dict[str, Any]], Any]) -> None:
        started = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - started
        if waited > self.SLOW_NOTE_SECONDS and not self._noted_slow:
            self._noted_slow = True
            print(f"hvdtrain: a checkpoint waited {waited:.1f} s for the previous one's write; "
                  "checkpoints come faster than the disk writes them (write fewer, e.g. a "
                  "larger --checkpoint-steps)", flush=True)
        copy = self.copy(state)
        if self.copy.from_gpu:
            torch.cuda.synchronize()  # the copies from the GPU (non_blocking) have landed
        # Not a daemon: should the interpreter exit without wait(), it still finishes the write.
        self._thread = threading.Thread(target=self._run, args=(write, copy),
                                        name="hvdtrain-checkpoint-writer")
        self._thread.start()

    def _run(self, write: Callable[[dict[str, Any]], Any], copy: dict[str, Any]) -> None:
        try:
            write(copy)
        except BaseException as e:  # noqa: BLE001 - raised again in the training thread
            self._error = e

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until the write in flight is done; then raise its error, if it had one (once)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
