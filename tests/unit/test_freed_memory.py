"""hvdtrain.freed_memory: malloc keeps freed blocks, so a training step stops faulting in
fresh pages; and a malloc the user tuned is left alone."""

import subprocess
import sys

from hvdtrain.freed_memory import user_tuned_malloc
from launch import REPO

HELPER = REPO / "tests" / "helpers" / "step_page_faults.py"


def faults_per_step(*runs: tuple[str, ...]) -> list[float]:
    """Each run of the helper with its arguments, side by side: page faults are counted per
    process, so neither run's figure depends on the other."""
    procs = [subprocess.Popen([sys.executable, str(HELPER), *args], stdout=subprocess.PIPE,
                              text=True) for args in runs]
    try:
        outs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out
    return [float(next(line for line in out.splitlines() if line.startswith("FAULTS "))[7:])
            for out in outs]


def test_a_step_stops_faulting_in_pages():
    plain, kept = faults_per_step((), ("keep",))
    assert plain > 200, plain  # glibc hands the gradients' blocks back each step
    # A fifth on a quiet machine; a loaded fresh-clone CI run read (296, 73.6): a quarter
    assert kept < plain / 3, (plain, kept)


def test_a_malloc_the_user_tuned_is_left_alone():
    assert not user_tuned_malloc({"PATH": "/bin", "LD_PRELOAD": "libfoo.so"})
    assert user_tuned_malloc({"MALLOC_TRIM_THRESHOLD_": "0"})
    assert user_tuned_malloc({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"})
    assert user_tuned_malloc({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
