"""How the benchmark scripts launch jobs: one environment and one way to run a command.

The environment puts this venv's bin (hvdtrain, horovodrun) first on PATH, lets Open MPI run as
root (CI and containers), and drops HOROVOD_ settings from the caller's shell, so that every job
of a benchmark runs with the settings the benchmark names and nothing else.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def launch_env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return env


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600,
        cwd: Path | None = None) -> str:
    """The command's stdout; a failed command ends the benchmark with its output."""
    proc = subprocess.run(cmd, env=launch_env() if env is None else env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return proc.stdout
