"""The DataLoader's own processes (--data-workers): how they start and how they end.

They start with forkserver (a fork after MPI has started can crash or hang; Horovod's examples
use forkserver too), with torch preloaded in the forkserver, and receive the dataset pickled,
its tensors as named shared-memory files. Nothing in torch ends them with the trainer (they are
the forkserver's children), so each watches the trainer's PID and exits when it is gone, and the
temp folders of trainers killed with all their processes are swept at the next start."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..processes import process_alive


@contextlib.contextmanager
def tensors_shared_by_name() -> Iterator[None]:
    """While loader processes start: the dataset's tensors go to them as shared-memory files
    named in the pickle, not as file descriptors. forkserver sends a new process at most about
    250 descriptors, so a Dataset holding more tensors than that (one per sample, as token
    sequences often are) failed with "too many fds". Only for the start: the batches coming
    back keep torch's default."""
    import torch.multiprocessing as torch_mp

    before = torch_mp.get_sharing_strategy()
    torch_mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        torch_mp.set_sharing_strategy(before)


# + the trainer's PID + "-": multiprocessing's pymp-* folder, short (a socket's path in it has
# room for about 107 characters, the temp folder's included: the PID namespace's tag, which the
# sweep needs too, is a file inside it instead of a part of its name)
TEMP_PREFIX = "pymp-hvd"
NAMESPACE_FILE = "pid-namespace"


def pid_namespace() -> str:
    """A tag of this process's PID namespace: a PID means something only inside its own, and a
    temp folder may be shared with containers that have theirs (Docker with /tmp mounted,
    Apptainer). Empty where /proc does not say."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def shared_temp_dir() -> str:
    """multiprocessing's temp folder (its sockets: the forkserver's, and the loader processes'
    for the batches' shared memory), made now, before the loader processes: each of them then
    inherits it instead of making a pymp-* folder of its own. A trainer that ends normally
    removes it; one killed alone (kill -9) leaves that to its loader processes
    (_exit_when_ended); where the launcher killed them all at once, the next start on the
    machine removes it (sweep_temp_dirs)."""
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config
    if config.get("tempdir") is None:  # multiprocessing has not made its own yet
        sweep_temp_dirs(Path(tempfile.gettempdir()))
        folder = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
        (Path(folder) / NAMESPACE_FILE).write_text(pid_namespace())
        util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
        config["tempdir"] = folder
    return config["tempdir"]


def sweep_temp_dirs(temp: Path) -> None:
    """Removes the temp folders of this PID namespace's trainers that are gone. A folder of
    another namespace (a container sharing the temp folder), or one that does not say, is left
    alone: its PID cannot be checked from here, and removing a live trainer's sockets would end
    its loader processes."""
    own = pid_namespace()
    for folder in temp.glob(f"{TEMP_PREFIX}*-*"):
        pid = folder.name[len(TEMP_PREFIX):].split("-", 1)[0]
        try:
            same = own and (folder / NAMESPACE_FILE).read_text() == own
        except OSError:
            same = False
        if same and pid.isdigit() and folder.stat().st_uid == os.getuid() and \
                not process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def end_with_trainer(trainer: int, temp_dir: str, worker_id: int) -> None:
    """worker_init_fn: end this loader process as soon as the training process ``trainer`` has
    ended, however it ended (SIGKILL, the stall watchdog's os._exit, MPI_Abort). Nothing else
    does: a loader process is the forkserver's child, so PR_SET_PDEATHSIG (which fires when the
    parent dies) and torch's own watchdog (which checks the parent's PID) watch the forkserver,
    and the forkserver and the resource tracker live while any loader process holds their pipes.
    All of them stayed under PID 1 holding their memory; ending the loader processes ends the
    other two, each of which exits when the last holder of its pipe is gone."""
    try:
        handle = os.pidfd_open(trainer)  # readable once the process has exited (Linux 5.3)
    except ProcessLookupError:  # the trainer ended before this process started
        shutil.rmtree(temp_dir, ignore_errors=True)
        os._exit(0)
    except (AttributeError, OSError):  # no pidfd on this system: poll the PID instead
        handle = None
    threading.Thread(target=_exit_when_ended, args=(trainer, handle, temp_dir), daemon=True,
                     name="hvdtrain-end-with-trainer").start()


def _exit_when_ended(trainer: int, handle: int | None, temp_dir: str) -> None:
    if handle is not None:
        select.select([handle], [], [])
    else:
        while process_alive(trainer):  # another user's counts (a reused PID, a setuid trainer)
            time.sleep(1)
    # A killed trainer removed nothing: its pymp-* folder would stay in the temp folder.
    shutil.rmtree(temp_dir, ignore_errors=True)
    os._exit(0)  # at once: no batch is wanted any more, and a clean exit could block on queues


def forkserver_preloads_torch() -> None:
    """Loader processes fork from the forkserver; with torch imported there once, they start in
    a fraction of a second instead of importing torch each (seconds on a busy machine). Takes
    effect only before the forkserver starts, and keeps the modules it already preloads."""
    from multiprocessing import forkserver

    preload = getattr(forkserver._forkserver, "_preload_modules", None) or ["__main__"]
    if "torch" not in preload:
        forkserver.set_forkserver_preload([*preload, "torch"])


def pickling_problem(obj: Any) -> str | None:
    try:
        pickle.dumps(obj)
    except Exception as e:  # PicklingError, AttributeError, TypeError: each says what failed
        return f"{type(e).__name__}: {e}"
    return None
