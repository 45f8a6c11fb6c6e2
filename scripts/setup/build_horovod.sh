#!/usr/bin/env bash
# Build (or fetch from the cache) a Horovod 0.28.1 wheel that works with the torch installed in
# $PYTHON's environment, and print the wheel's path on the last line of stdout.
#
# This is the single place where Horovod is patched and built: scripts/setup/setup.sh and the
# Dockerfile both call it. The wheel is cached under $HVDTRAIN_CACHE keyed by the Horovod, torch
# and Python versions and the build flags, so a second setup takes seconds.
#
# Environment:
#   PYTHON                  interpreter whose torch to build against (default: python3)
#   HVDTRAIN_CACHE          cache folder (default: ~/.cache/hvdtrain)
#   HOROVOD_GPU_OPERATIONS  set to NCCL for a GPU build (needs a CUDA torch and nvcc)
#
# A wheel under the repository's wheels/<key>/ (the same key as the cache's; scripts/image/build.sh
# puts this machine's there for an image build) is used as it is: no download, no compiler.
set -euo pipefail

HOROVOD_VERSION=0.28.1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Every horovod-<version>-*.patch here, in name order: the torch2 build fix, the
# wake-on-enqueue change, then the zero-copy allreduce (each file says why).
patch_files=("$here/horovod-${HOROVOD_VERSION}-"*.patch)
PYTHON="${PYTHON:-python3}"
cache_root="${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}"

log() { echo "[build_horovod] $*" >&2; }

versions="$("$PYTHON" -c 'import sys, torch; print(f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__}")')" || {
    log "error: torch is not importable from $PYTHON; install torch first"; exit 1; }
gpu_ops="${HOROVOD_GPU_OPERATIONS:-none}"
key="horovod${HOROVOD_VERSION}-${versions}-gpu_${gpu_ops}-$(cat "${patch_files[@]}" | sha1sum | cut -c1-8)"
cache_dir="$cache_root/wheels/$key"

local_dir="$(cd "$here/../.." && pwd)/wheels/$key"
# The cache first: a machine that has both keeps the wheel its venv records (setup.sh reinstalls
# Horovod when that path changes).
cached="$(ls "$cache_dir"/horovod-*.whl 2>/dev/null | head -n1 || true)"
[[ -n "$cached" ]] || cached="$(ls "$local_dir"/horovod-*.whl 2>/dev/null | head -n1 || true)"
if [[ -n "$cached" ]]; then
    if [[ "$cached" == "$local_dir"/* ]]; then log "local wheel: $key"; else log "cache hit: $key"; fi
    echo "$cached"
    exit 0
fi

log "cache miss: building $key (a few minutes)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The sdist is the only form Horovod 0.28.1 is published in.
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "horovod==${HOROVOD_VERSION}" -d "$work" >&2
tar -xzf "$work/horovod-${HOROVOD_VERSION}.tar.gz" -C "$work"
src="$work/horovod-${HOROVOD_VERSION}"
for patch_file in "${patch_files[@]}"; do
    patch -p1 --forward --directory "$src" < "$patch_file" >&2
done

# The build runs against the torch already installed (--no-build-isolation) and never against a
# fresh copy that pip would otherwise pull into an isolated build environment.
"$PYTHON" -m pip install --quiet setuptools wheel packaging cloudpickle psutil pyyaml cffi >&2
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export CMAKE_POLICY_VERSION_MINIMUM=3.5   # in case a cmake 4.x is first on PATH (bundled Gloo is old)
export MAKEFLAGS="-j$(nproc)"
if [[ "$gpu_ops" != none ]]; then export HOROVOD_GPU_OPERATIONS="$gpu_ops"; fi

start=$SECONDS
"$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" >&2
log "built in $((SECONDS - start)) s"

mkdir -p "$cache_dir"
wheel="$(ls "$work"/dist/horovod-*.whl | head -n1)"
# Copy then rename, so an interrupted build never leaves a half-written wheel in the cache.
cp "$wheel" "$cache_dir/.partial"
mv "$cache_dir/.partial" "$cache_dir/$(basename "$wheel")"
echo "$cache_dir/$(basename "$wheel")"
