"""hvdtrain.freed_memory: malloc keeps freed blocks, so a training step stops faulting in
fresh pages; and a malloc the user tuned is left alone."""

import os
import subprocess
import sys

from hvdtrain.freed_memory import user_tuned_malloc
from launch import REPO

HELPER = REPO / "tests" / "helpers" / "step_page_faults.py"


# glibc's mmap threshold starts at 128 KiB and moves with the heap's history: left alone, a
# 40-step run handed the gradients' blocks back on most steps or on almost none (108 to 1828
# faults a step, a bimodal 0 or ~2000 per step). Pinned at its start, the control hands them
# back every step (2245 to 2570 a step): what the harness must see for the kept run to mean
# anything.
HANDS_BACK = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def faults_per_step(*runs: tuple[tuple[str, ...], dict]) -> list[tuple[float, float]]:
    """(mean, median) page faults a step for each run of the helper (its arguments, its extra
    environment), side by side: faults are counted per process, so neither run's figure
    depends on the other."""
    procs = [subprocess.Popen([sys.executable, str(HELPER), *args], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, **extra}) for args, extra in runs]
    try:
        outs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out
    lines = [next(line for line in out.splitlines() if line.startswith("FAULTS ")) for out in outs]
    return [tuple(float(n) for n in line.split()[1:]) for line in lines]


def test_a_step_stops_faulting_in_pages():
    handing_back, kept = faults_per_step(((), HANDS_BACK), (("keep",), {}))
    assert handing_back[1] > 1000, handing_back  # a step's gradients, faulted in again
    assert kept[1] <= 10, kept  # a typical step faults in nothing (0 seen every time)
    # a rare step still faults (a mean of 1.6 to 48 against 2350 to 2510 handing back)
    assert kept[0] < handing_back[0] / 10, (handing_back, kept)


def test_a_malloc_the_user_tuned_is_left_alone():
    assert not user_tuned_malloc({"PATH": "/bin", "LD_PRELOAD": "libfoo.so"})
    assert user_tuned_malloc({"MALLOC_TRIM_THRESHOLD_": "0"})
    assert user_tuned_malloc({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"})
    assert user_tuned_malloc({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
