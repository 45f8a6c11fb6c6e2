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
    return True
