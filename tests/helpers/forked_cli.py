"""Run many `hvdtrain` command lines, each in a process forked from this one once torch and
hvdtrain's modules are imported, so that every case skips the seconds of torch's import (the
bad-input tests, whose cases all end before training: one launch for all of them).

Each child is the console script: sys.argv set, sys.exit(main()), its stdout and stderr the
case's files; an exception that escapes main() ends it as it ends that script (a traceback,
exit 1). Two children run at a time: what is left of a case's seconds is mostly its own.

    python forked_cli.py CASES.json

CASES.json holds a list of {"argv": [...], "out": path, "err": path}; this prints the list of
the children's exit codes as JSON. Tests call run_forked().
"""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path


def run_forked(argvs: list[list[str]], folder: Path, cwd: Path | None = None,
               timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Each of ``argvs`` (hvdtrain's arguments) as `hvdtrain ARGV` would end: its exit code,
    stdout and stderr; ``folder`` keeps the cases' files."""
    from launch import run  # tests/ is on the test's path, not on this script's

    folder.mkdir(parents=True, exist_ok=True)
    cases = [{"argv": argv, "out": str(folder / f"{i}.out"), "err": str(folder / f"{i}.err")}
             for i, argv in enumerate(argvs)]
    (folder / "cases.json").write_text(json.dumps(cases))
    codes = json.loads(run([sys.executable, __file__, str(folder / "cases.json")], cwd=cwd,
                           timeout=timeout).stdout)
    assert len(codes) == len(cases), codes
    return [subprocess.CompletedProcess(["hvdtrain", *case["argv"]], code,
                                        Path(case["out"]).read_text(),
                                        Path(case["err"]).read_text())
            for case, code in zip(cases, codes)]


def console_script(main, case: dict) -> None:
    """In the child: never returns."""
    for fd, path in ((1, case["out"]), (2, case["err"])):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    sys.argv = ["hvdtrain", *case["argv"]]
    sys.exit(main())


def run_all(cases: list[dict], at_once: int = 2) -> list[int]:
    # The imports every child would otherwise pay for: torch, the digits' loader (sklearn), the
    # modules of hvdtrain's train and compare commands, and torch._dynamo, which a torch
    # optimizer's first construction imports (seconds; every child that trains builds one).
    import sklearn.datasets  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401

    import hvdtrain.compare.command  # noqa: F401
    import hvdtrain.loop  # noqa: F401
    import hvdtrain.workload  # noqa: F401
    from hvdtrain.cli import main

    # The objects imported so far never become garbage: out of the collector's sight, a child's
    # collections skip them (a third of a simulating child's time) and leave their pages shared.
    gc.freeze()
    codes: list[int | None] = [None] * len(cases)
    running: dict[int, int] = {}  # pid -> index of its case

    def reap() -> None:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)

    for index, case in enumerate(cases):
        if len(running) >= at_once:
            reap()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            console_script(main, case)
        running[pid] = index
    while running:
        reap()
    return codes


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(run_all(json.load(f))))
