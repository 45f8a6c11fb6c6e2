"""Whether a process still runs on this host: asked by what cleans up after processes that were
killed (a checkpoint's temporary file, a loader's temp folder) and by loader processes that must
end with their trainer."""

import os


def process_alive(pid: int) -> bool:
    """True while process ``pid`` exists in this PID namespace, another user's included."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else (or the PID was reused)
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits for its parent to read its exit code (a process
    that os._exit ended, while its parent still reads its output): it is no longer running."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False
