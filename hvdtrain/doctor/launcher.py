"""The doctor with a launcher line: run ``LAUNCHER ARGS... <python> -m hvdtrain.doctor.rank``
within --timeout, read the ranks' "started" lines and rank 0's facts from the launcher's output,
and judge them here, where the launcher's own environment is known. A launcher still running at
the deadline is ended with its whole session, and the hosts that never answered are named."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..exit_codes import EXIT_BAD_INPUT
from .asked import (Asked, DoctorInput, from_launcher, from_probe_options, launcher_kind,
                    parse_host_slots)
from .facts import environment
from .problem import Problem
from .rank import FACTS, STARTED, STEP, resolve

# The probe's lines, wherever the launcher puts them: horovodrun tags each with
# "[1,0]<stdout>:" (Open MPI's --tag-output), srun's --label with "0: ".
MARKED = re.compile(f"({STARTED}|{FACTS}|{STEP}) (.*)")
# Open MPI's tag also lands inside a long line, where its output was read in pieces.
TAGGED = re.compile(r"\[\d+,\d+\]<std(out|err)>:")
END_S = 5.0  # kept for ending the launcher and writing the verdict
RANKS_S = 10.0  # the least the ranks get: MPI's start, the probe's imports and measurements


def python_for_ranks() -> str:
    """The python the ranks start: found on each host's PATH, as a job's `python` or `hvdtrain`
    would be, when this one is the PATH's; else this one's path."""
    name = Path(sys.executable).name
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return name
    return sys.executable


def probe_command(command: list[str], args, timeout: float) -> list[str]:
    """The launcher line with the probe appended. horovodrun is told --mpi: the probe talks
    over MPI, which horovodrun's Gloo mode does not start."""
    kind = launcher_kind(command)
    if kind == "horovodrun":
        if "--gloo" in command:
            raise DoctorInput("horovodrun --gloo: the doctor's probe talks over MPI; leave out "
                              "--gloo (the checks still report Horovod's Gloo build)")
        if "--mpi" not in command:
            command = [command[0], "--mpi", *command[1:]]
    probe = [python_for_ranks(), "-m", "hvdtrain.doctor.rank", "--facts-to-stdout",
             "--timeout", f"{timeout:g}", "--deadline", f"{time.time() + timeout:.3f}",
             "--run-dir", args.run_dir, "--sizes", args.sizes]
    if args.env:
        probe += ["--env", args.env]
    return [*command, *probe]


class Output:
    """The launcher's output, read as it comes: started ranks, rank 0's facts, the rest."""

    def __init__(self, stream, echo) -> None:
        self.started: dict[int, dict] = {}  # rank -> its host and addresses
        self.facts: dict | None = None  # rank 0's, the measurements in them once "partial" is not
        self.step: str | None = None  # what the ranks were doing last
        self.other: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream, echo), daemon=True)
        self._thread.start()

    def _read(self, stream, echo) -> None:
        for line in stream:
            found = MARKED.search(line)
            kind, text = (found.group(1), TAGGED.sub("", found.group(2)).rstrip()) if found \
                else ("", "")
            words = text.split()
            if kind == STARTED and len(words) >= 2 and words[0].isdigit():
                found = words[2].split(",") if len(words) > 2 else []
                self.started[int(words[0])] = {"host": words[1],
                                               "addresses": dict(enumerate(found))}
            elif kind == FACTS:
                self.facts = json.JSONDecoder().raw_decode(text)[0]
            elif kind == STEP:
                self.step = text.strip()
            else:
                self.other.append(line)
                echo(line)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _echo(line: str) -> None:
    print(line, end="", file=sys.stderr, flush=True)


def run_launcher(command: list[str], timeout: float) -> tuple[int | None, Output]:
    """Run the launcher; its exit code, or None when it was ended at the deadline."""
    from ..requeue import end_session

    try:
        launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
    except OSError as e:
        raise DoctorInput(f"cannot start {command[0]} ({e.strerror or e}); give a launcher on "
                          "PATH") from None
    output = Output(launcher.stdout, _echo)
    try:
        code = launcher.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_session(launcher)
        code = None
    output.join(2.0)
    return code, output


def run_doctor(command: list[str], args) -> int:
    from .verdict import conclude, unfinished_report, write_and_judge

    hostfile = getattr(args, "hostfile", None)  # on its own: what the job's hostfile asks for
    asked = (Asked(parse_host_slots(args.expect, "--expect"), None, "--expect") if args.expect
             else from_probe_options(None, hostfile) if hostfile else from_launcher(command))
    budget = args.timeout - END_S  # the probe's own, less a second to report
    if budget < RANKS_S:  # the ranks had half a second, and were said to have had --timeout
        raise DoctorInput(f"--timeout {args.timeout:g}: with a launcher line the doctor keeps "
                          f"{END_S:g} s to end the launcher and report, which leaves the ranks "
                          f"{max(budget, 0):g} s, too few to start and measure (a healthy "
                          f"host takes about 5); give --timeout {END_S + RANKS_S:g} or more")
    code, output = run_launcher(probe_command(command, args, budget - 1.0), budget)
    facts = output.facts
    if facts is not None and facts.get("partial"):
        facts["problems_before"] = [hung(output.step, budget)]
    if facts is None:
        problems = _no_facts(code, output, asked, budget)
        for problem in problems:
            print(problem.line(), flush=True)
        write_and_judge(args.json, unfinished_report(asked, problems, len(output.started)),
                        len(problems), sys.stdout)
        return EXIT_BAD_INPUT
    facts["launcher"] = launcher_kind(command)
    facts["launcher_env"] = environment(dict(os.environ), args.env_names)
    facts["resolved"] = resolve(list(asked.hosts))
    return conclude(facts, asked, args.run_dir, args.json)


def hung(step: str | None, timeout: float) -> Problem:
    """The ranks started and reported, but did not finish: where they hung."""
    return Problem("network", f"the ranks hung in {step or 'their tests'} and were ended after "
                   f"{timeout:g} s", "check that MPI can connect those hosts (a firewall, "
                   "btl_tcp_if_include naming an interface they do not share), or raise "
                   "--timeout")


def _no_facts(code: int | None, output: Output, asked: Asked, timeout: float) -> list[Problem]:
    from .host_checks import never_started

    if code is None:
        resolved = resolve(list(asked.hosts))
        unreachable = (ssh_unreachable(list(asked.hosts), resolved)
                       if not output.started and (asked.source == "-H" or
                                                  asked.source.startswith("hostfile ")) else {})
        return never_started(asked, output.started, asked.np or asked.slots or None, timeout,
                             resolved, unreachable)
    missing = next((line.strip() for line in output.other if "No module named" in line), None)
    if missing:
        return [Problem("versions", "a rank cannot import what the doctor needs "
                        f"({missing[-160:]})", "install hvdtrain (with mpi4py) in the same venv "
                        f"on every host, and put it first on PATH there ({python_for_ranks()} is "
                        "what the ranks ran)")]
    tail = " | ".join(line[:160] for line in _launcher_says(output.other))
    return [Problem("hosts", f"the launcher exited {code} before the ranks reported "
                    f"({len(output.started)} rank(s) started){': ' + tail if tail else ''}",
                    "read the launcher's output above: a host it cannot reach, a rank that "
                    "cannot import hvdtrain there, or a wrong launcher flag")]


def ssh_unreachable(hosts: list[str], resolved: dict[str, str],
                    timeout_s: float = 5.0) -> dict[str, str]:
    """Host -> why ssh from here fails, for the hosts of an mpirun or horovodrun line other than
    this one (they start their remote ranks over ssh), each tried at once with a timeout:
    where no rank started, the launcher's own wait names none of them."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from .host_checks import short

    here = {"localhost", socket.gethostname(), short(socket.gethostname())}
    remote = [h for h in dict.fromkeys(hosts)
              if h not in here and not resolved.get(h, "").startswith("127.")]

    def attempt(host: str) -> str | None:
        try:
            done = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o",
                                   f"ConnectTimeout={timeout_s:g}", host, "true"],
                                  capture_output=True, text=True, timeout=timeout_s + 3)
        except FileNotFoundError:
            return None  # no ssh here to ask with
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout_s:g} s"
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        return None if done.returncode == 0 else (said[-1][:160] if said else
                                                  f"ssh exited {done.returncode}")

    with ThreadPoolExecutor(max(1, min(16, len(remote)))) as pool:
        reasons = dict(zip(remote, pool.map(attempt, remote)))
    return {host: why for host, why in reasons.items() if why}


def _launcher_says(lines: list[str]) -> list[str]:
    """The lines of a launcher's failure worth quoting: ssh's or srun's error lines, else the
    first sentence of Open MPI's first message (it boxes each in rules of dashes and ends with
    generic advice; a second box, "An internal error has occurred in ORTE", only follows the
    first), else its error lines, else the first two lines."""
    text = [line.strip() for line in lines if line.strip().strip("-")]
    errors = [line for line in text if "error" in line.lower()]
    remote = [line for line in text if line.lower().startswith(("ssh:", "srun:"))]
    return (remote or _first_boxed(lines) or errors or text)[:2]


def _first_boxed(lines: list[str]) -> list[str]:
    """The first paragraph of Open MPI's first boxed message, as one line; [] without one."""
    inside, paragraph = False, []
    for line in (line.strip() for line in lines):
        if line and not line.strip("-"):  # a rule of dashes: the box opens, or closes
            if inside:
                break
            inside = True
        elif inside and line:
            paragraph.append(line)
        elif inside and paragraph:  # the blank line that ends the first paragraph
            break
    return [" ".join(paragraph)] if paragraph else []
