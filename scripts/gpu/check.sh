#!/usr/bin/env bash
# The GPU check, in one go, on a machine with CUDA, nvcc and a CUDA PyTorch and no network:
# builds Horovod 0.28.1 with NCCL, MPI and Gloo from the carried bundle (`make gpu-bundle`),
# installs hvdtrain against the machine's own torch in a venv, runs every CUDA-gated test
# (scripts/gpu/cuda_tests.py lists them) and the GPU benchmark (scripts/bench_gpu.py), each step
# under a timeout, and writes one results file with each step's status and output tail.
#
# Without a CUDA device (or with --cpu-dry-run) it builds Horovod without NCCL, installs, and
# stops before the device step: that proves the bundle and the offline build anywhere.
#
#   bash scripts/gpu/check.sh [--out FILE] [--bundle DIR] [--venv DIR] [--only tests|bench]
#                             [--cpu-dry-run]
#
# Defaults: --out $OUT/gpu-check.txt (the device tool's OUT), else build/gpu-check.txt;
# --bundle build/gpu-bundle; --venv build/gpu-check/venv. --only: the device steps to run, the
# CUDA-gated tests or the GPU benchmark (default both). The venv and the Horovod wheel stay in
# build/gpu-check, so a second call on the same (still warm) machine skips the build: the device
# tool limits one call to 600 s, and the build with both device steps can pass that. PYTHON
# (default python3) is the interpreter that holds the machine's torch; it may itself be a venv's.
# HOROVOD_BUILD_TIMEOUT: seconds for the Horovod build (default 300, for 16 cores).
# Exit status: 0 when every step that ran passed, 1 otherwise.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$repo/scripts/gpu"
PYTHON="${PYTHON:-python3}"
bundle="$repo/build/gpu-bundle"
out="${OUT:+$OUT/gpu-check.txt}"
out="${out:-$repo/build/gpu-check.txt}"
venv=""
only=""
dry_run=0
while (($#)); do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --bundle) bundle="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        --only) only="$2"; shift 2
                [[ "$only" == tests || "$only" == bench ]] \
                    || { echo "check.sh: --only takes tests or bench, not '$only'" >&2; exit 2; } ;;
        --cpu-dry-run) dry_run=1; shift ;;
        -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "check.sh: unknown argument $1; see --help" >&2; exit 2 ;;
    esac
done
bundle="$(cd "$bundle" 2>/dev/null && pwd || echo "$bundle")"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
full_log="${out%.txt}-full.log"
work="$(mktemp -d "${TMPDIR:-/tmp}/hvdtrain-gpu-check.XXXXXX")"
state="$repo/build/gpu-check"  # kept between calls (git ignores build/)
venv="${venv:-$state/venv}"
failed=0
started=$SECONDS
# Never reach for an index: everything comes from the bundle or is already on the machine.
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$bundle" PIP_DISABLE_PIP_VERSION_CHECK=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export HVDTRAIN_CACHE="$state/cache"
# torch's CUDA_HOME and Horovod's build look for nvcc on PATH first.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
: > "$out"; : > "$full_log"

say() { echo "$*" | tee -a "$out" "$full_log" >&2; }

# step NAME TIMEOUT_S COMMAND...: run it, log all its output, and put its status and the last
# 40 lines in the results file. A failed step is recorded; the caller decides whether to go on.
step() {
    local name="$1" limit="$2"; shift 2
    local log="$work/$name.log" t0=$SECONDS rc
    say "== $name: running (limit ${limit} s)"
    # The steps are functions (check_steps.sh), exported, so that timeout can run them.
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" > "$log" 2>&1
    rc=$?
    local status="ok"
    ((rc == 124 || rc == 137)) && status="TIMED OUT after ${limit} s"
    ((rc != 0 && rc != 124 && rc != 137)) && status="FAILED (exit $rc)"
    ((rc != 0)) && failed=1
    # Plain text only: build tools print colour codes, carriage returns, NULs.
    { echo "== $name: $status in $((SECONDS - t0)) s"
      tail -n 40 "$log" | tr -d '\r\000' | sed 's/\x1b\[[0-9;]*[a-zA-Z]//g'; echo; } >> "$out"
    { echo "== $name: $status"; cat "$log"; echo; } >> "$full_log"
    echo "== $name: $status in $((SECONDS - t0)) s" >&2
    return "$rc"
}

finish() {
    say "== total: $((SECONDS - started)) s; $([[ $failed == 0 ]] && echo "all steps ok" \
        || echo "some steps FAILED (see above)"); results: $out, full log: $full_log"
    rm -rf "$work"
    exit "$failed"
}

source "$here/check_steps.sh"
export -f describe_machine check_bundle make_venv check_mpi why_no_gpu choose_gpu_ops cuda_env \
    nccl_env build_horovod check_horovod_build install_hvdtrain run_cuda_tests
py="$venv/bin/python"
export repo bundle venv work PYTHON py dry_run
build_limit="${HOROVOD_BUILD_TIMEOUT:-300}"   # about 2-3 min with 16 cores; 10 min with 2

say "# hvdtrain GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), ${HOSTNAME:-unknown host}, $(nproc) cores"
say "# tree: $(git -C "$repo" log -1 --format='%h %s' 2>/dev/null | cut -c1-90 || echo unknown)"
step environment 60 describe_machine || finish
step bundle 60 check_bundle || finish
step venv 120 make_venv || finish
export PATH="$venv/bin:$PATH" LD_LIBRARY_PATH="$venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step mpi 60 check_mpi || finish
gpu_ops="$(choose_gpu_ops)"
say "# Horovod GPU operations: ${gpu_ops:-none ($(why_no_gpu))}"
if ! step horovod-build "$build_limit" build_horovod "$gpu_ops"; then
    [[ -n "$gpu_ops" ]] || finish
    say "# the NCCL build failed: building without GPU operations, so the CUDA steps still run"
    gpu_ops=""
    step horovod-build-cpu-ops "$build_limit" build_horovod "" || finish
fi
step horovod-check-build 120 check_horovod_build "$gpu_ops" || finish
step hvdtrain-install 180 install_hvdtrain || finish
if ((dry_run)) || ! "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    say "no CUDA device: stopping before the device step ($(why_no_gpu))"
    finish
fi
[[ "$only" == bench ]] || step cuda-tests 240 run_cuda_tests
[[ "$only" == tests ]] \
    || step bench-gpu 400 "$py" "$repo/scripts/bench_gpu.py" --rounds 1 --no-cpu --run-timeout 120
finish
