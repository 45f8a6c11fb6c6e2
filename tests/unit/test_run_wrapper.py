"""`hvdtrain run` (requeue.py) in-process: what it reads of the ranks' lines, the code it exits
with, and that it imports no torch before its stop handler is in place (issue 41). The launches
themselves are tests/multiproc/test_requeue.py's."""

import subprocess
import sys

from hvdtrain import requeue


def _lines(tmp_path, *lines):
    path = tmp_path / "ranks"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_the_ranks_have_started_once_every_rank_on_the_host_said_so(tmp_path):
    assert not requeue.ranks_ready(tmp_path / "none-yet")
    assert not requeue.ranks_ready(_lines(tmp_path, "ready 11 2"))
    assert not requeue.ranks_ready(_lines(tmp_path, "ready 11 2", "ready 11 2"))  # one rank
    assert requeue.ranks_ready(_lines(tmp_path, "ready 11 2", "exit 11 0", "ready 12 2"))
    assert requeue.ranks_ready(_lines(tmp_path, "ready 11 1"))  # hvdtrain train alone
    assert not requeue.ranks_ready(_lines(tmp_path, "ready 11 x", "garbage", "ready 1"))


def test_the_wrapper_exits_with_the_ranks_own_code_where_the_launcher_says_otherwise(
        tmp_path, capsys):
    # mpirun under its recovery settings says 1 (or 0), horovodrun 1, for ranks that exited 2
    refused = _lines(tmp_path, "exit 11 2", "exit 12 2")
    assert requeue._job_code(1, refused, stopped=False) == 2
    assert "exit 2, the ranks' own code (the launcher's: 1)" in capsys.readouterr().err
    assert requeue._job_code(0, refused, stopped=False) == 2
    assert requeue._job_code(2, refused, stopped=False) == 2  # plain mpirun: the same, quietly
    assert capsys.readouterr().err.count("the ranks' own code") == 1
    done = _lines(tmp_path, "exit 11 0", "exit 12 0")
    assert requeue._job_code(137, done, stopped=False) == 137  # the launcher's own failure
    assert requeue._job_code(0, tmp_path / "no-lines", stopped=False) == 0


def test_the_job_has_failed_once_a_rank_here_failed_or_a_watched_one_died(tmp_path):
    """Each ended the job; the wrapper waited out mpirun's abort under its 60 s sigkill timeout,
    twice (about 2 minutes), where a failed rank's own code was known after 6 s."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a PID that has ended (and been reaped)
    assert not requeue.job_failed(_lines(tmp_path, "ready 11 2", "exit 11 0", "exit 12 75"))
    assert requeue.job_failed(_lines(tmp_path, "exit 11 0", "exit 12 1"))
    assert requeue.job_failed(_lines(tmp_path, "exit 12 2"))
    died = _lines(tmp_path, f"ready {gone.pid} 2", f"watched {gone.pid} 1")
    assert requeue.job_failed(died) and requeue.rank_died(died) == gone.pid
    # not watched (mpirun's recovery or --elastic survives it, or fit() records no code), or
    # its exit recorded, or alive: the job goes on
    assert not requeue.job_failed(_lines(tmp_path, f"ready {gone.pid} 2"))
    assert not requeue.job_failed(_lines(tmp_path, f"watched {gone.pid} 1", f"exit {gone.pid} 0"))
    import os
    assert not requeue.job_failed(_lines(tmp_path, f"watched {os.getpid()} 1"))
    # a rank killed: 137 wins over the code of the rank that failed after it
    assert requeue._job_code(137, _lines(tmp_path, "exit 11 1"), stopped=False) == 137


def test_a_rank_is_watched_only_where_the_job_cannot_go_on_without_it(tmp_path, monkeypatch):
    from hvdtrain.loop.preemption import process_signals

    path = tmp_path / "ranks"
    monkeypatch.setenv(requeue.RANKS_FILE_ENV, str(path))
    monkeypatch.delenv("OMPI_MCA_orte_enable_recovery", raising=False)
    monkeypatch.setattr(process_signals, "in_fit", False)

    def watched(**options):
        path.write_text("")
        requeue.rank_started(**options)
        assert requeue.rank_lines(path, "ready")
        return bool(requeue.rank_lines(path, "watched"))
    assert watched()
    assert not watched(survivable=True)  # --elastic
    monkeypatch.setattr(process_signals, "in_fit", True)
    assert not watched()  # fit() records no exit code
    monkeypatch.setattr(process_signals, "in_fit", False)
    monkeypatch.setenv("OMPI_MCA_orte_enable_recovery", "1")
    assert not watched()  # mpirun survives a lost async worker


def test_tell_wrapper_writes_only_under_the_wrapper(tmp_path, monkeypatch):
    monkeypatch.delenv(requeue.RANKS_FILE_ENV, raising=False)
    requeue.tell_wrapper("exit", 2)  # no file named: nothing to do
    monkeypatch.setenv(requeue.RANKS_FILE_ENV, str(tmp_path / "ranks"))
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3")
    requeue.rank_started()
    requeue.tell_wrapper("exit", 2)
    assert list(requeue.rank_lines(tmp_path / "ranks", "ready").values()) == [3]
    assert list(requeue.rank_lines(tmp_path / "ranks", "exit").values()) == [2]


def test_the_wrapper_imports_no_torch():
    # It used to import torch (1.3 s) before it installed its handler: a SIGTERM meanwhile
    # ended it with 143 and no line of its own.
    code = ("import sys\nfrom hvdtrain.cli import main\n"
            "code = main(['run', sys.executable, '-c', 'pass'])\n"
            "print(code, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["0", "False"], (proc.stdout, proc.stderr)


def test_the_commands_help_imports_no_torch():
    """`hvdtrain --help` and `hvdtrain compare --help` took 2.5 s, nearly all of it importing
    torch through the update rules' registry (rules/apply.py)."""
    code = ("import sys\nfrom hvdtrain.cli import main\n"
            "for argv in (['--help'], ['compare', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        print(e.code)\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split()[-1] == "0" and proc.stderr.split() == ["False"], (
        proc.stdout[-500:], proc.stderr)


def test_a_stop_before_the_launcher_starts_starts_nothing(capsys):
    import signal
    from types import SimpleNamespace

    relay = requeue.StopRelay()
    try:
        relay._handle(signal.SIGTERM, None)
        assert requeue.main(SimpleNamespace(launch_command=["sleep", "30"]), relay) == 75
    finally:
        relay.restore()
    err = capsys.readouterr().err
    assert "SIGTERM while the job started" in err and "the launcher was not started" in err


def _refusing_launcher(tmp_path, then=""):
    """A launcher whose rank refuses its input (exit 2 in the ranks' file) while the launcher
    itself lingers, as mpirun does when it aborts the other ranks under the wrapper's sigkill
    timeout (about 120 s); ``then``: a shell line it runs after the refusal."""
    script = tmp_path / "launcher.sh"
    script.write_text(f'#!/bin/sh\necho "exit $$ 2" >> "${requeue.RANKS_FILE_ENV}"\n{then}\n'
                      'sleep 60\n')
    script.chmod(0o755)
    return [str(script)]


def test_a_rank_that_refused_its_input_ends_the_job_with_2_soon(tmp_path, capsys):
    import time
    from types import SimpleNamespace

    relay = requeue.StopRelay()
    started = time.monotonic()
    try:
        code = requeue.main(SimpleNamespace(launch_command=_refusing_launcher(tmp_path)), relay)
    finally:
        relay.restore()
    assert code == 2 and time.monotonic() - started < requeue.LINGER_S + 10
    assert "exit 2, the ranks' own code" in capsys.readouterr().err


def test_a_stop_after_a_refusal_is_no_requeue(tmp_path, capsys):
    from types import SimpleNamespace

    relay = requeue.StopRelay()
    # a scheduler's stop, to the wrapper, once the refusal is recorded (a timer raced it)
    launcher = _refusing_launcher(tmp_path, then="kill -TERM $PPID")
    try:
        code = requeue.main(SimpleNamespace(launch_command=launcher), relay)
    finally:
        relay.restore()
    assert relay.received == [15]  # the stop did land
    assert code == 2, capsys.readouterr().err  # was 75: "requeue", to be refused again
    assert "SIGTERM while the job started" not in capsys.readouterr().err
