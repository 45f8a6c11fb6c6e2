"""Run many `hvdtrain` command lines, each in a process forked from this one once torch and
hvdtrain's training modules are imported, so that every case skips the seconds of torch's import
(tests/multiproc/test_user_workloads.py's bad-input cases, which all end before training).

Each child is the console script: sys.argv set, sys.exit(main()), its stdout and stderr the
case's files; an exception that escapes main() ends it as it ends that script (a traceback,
exit 1). Two children run at a time: what is left of a case's seconds is mostly its own.

    python forked_cli.py CASES.json

CASES.json holds a list of {"argv": [...], "out": path, "err": path}; this prints the list of
the children's exit codes as JSON.
"""

import json
import os
import sys

# The imports every child would otherwise pay for: torch, the digits' loader (sklearn), and the
# modules of hvdtrain's train command.
import sklearn.datasets  # noqa: F401
import torch  # noqa: F401

import hvdtrain.compare.command  # noqa: F401
import hvdtrain.loop  # noqa: F401
import hvdtrain.workload  # noqa: F401
from hvdtrain.cli import main


def console_script(case: dict) -> None:
    """In the child: never returns."""
    for fd, path in ((1, case["out"]), (2, case["err"])):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    sys.argv = ["hvdtrain", *case["argv"]]
    sys.exit(main())


def run_all(cases: list[dict], at_once: int = 2) -> list[int]:
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
            console_script(case)
        running[pid] = index
    while running:
        reap()
    return codes


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(run_all(json.load(f))))
