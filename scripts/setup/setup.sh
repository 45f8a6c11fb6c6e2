#!/usr/bin/env bash
# One idempotent setup for a fresh Debian machine (or a Docker build stage):
#   Open MPI and build tools from apt, a virtualenv, torch, a patched Horovod build (cached),
#   hvdtrain in editable mode, and a check that Horovod lists PyTorch, MPI and Gloo.
# Running it again on a set-up machine takes seconds.
#
# Environment:
#   VENV           virtualenv folder (default: .venv in the repository)
#   PYTHON         interpreter that creates the venv (default: python3)
#   TORCH_SPEC     pip requirement for torch (default: torch==2.13.0, the CPU build on this disk);
#                  for a GPU cluster, e.g. TORCH_SPEC=torch==2.5.1 TORCH_INDEX_URL=<cu124 index>
#   TORCH_INDEX_URL  extra index to find TORCH_SPEC in (optional)
#   HVDTRAIN_EXTRAS  extras to install with hvdtrain (default: dev,mlflow,wandb: the tests of
#                  --tracker need both trackers; about 60 s and 210 MB more than dev alone)
#   HOROVOD_GPU_OPERATIONS  NCCL for a GPU build
#   HVDTRAIN_INSTALL  editable (default) installs hvdtrain itself; deps installs only what
#                  pyproject.toml lists and stops (the Dockerfile's cached layer, before the source)
#
# Local wheels: a wheels/ folder in the repository (scripts/image/build.sh fills it; see its
# README) is a pip --find-links for every install here, and build_horovod.sh takes a Horovod wheel
# from it instead of building one, so an image builds from the wheels of the machine that builds it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-$repo/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
HVDTRAIN_EXTRAS="${HVDTRAIN_EXTRAS:-dev,mlflow,wandb}"

log() { echo "[setup] $*" >&2; }

if compgen -G "$repo/wheels/*.whl" >/dev/null; then
    # pip reads a space-separated list from the variable; a find-links of the machine's own stays
    export PIP_FIND_LINKS="$repo/wheels${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
    log "local wheels: $repo/wheels"
fi

# --- system packages -------------------------------------------------------------------------
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v patch >/dev/null || missing+=(patch)
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "error: missing system packages: ${missing[*]}"
        log "run as root, or: sudo apt-get install -y ${missing[*]}"
        exit 1
    fi
    log "installing from apt: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- virtualenv and torch --------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
pip_quiet=(--quiet --disable-pip-version-check)

torch_have="$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
if ! "$py" - "$TORCH_SPEC" "$torch_have" <<'PY' 2>/dev/null
import sys
from packaging.requirements import Requirement
spec, have = sys.argv[1], sys.argv[2]
sys.exit(0 if have and Requirement(spec).specifier.contains(have.split("+")[0], prereleases=True) else 1)
PY
then
    log "installing $TORCH_SPEC"
    "$py" -m pip install "${pip_quiet[@]}" packaging numpy
    index_args=()
    [[ -n "${TORCH_INDEX_URL:-}" ]] && index_args=(--extra-index-url "$TORCH_INDEX_URL")
    "$py" -m pip install "${pip_quiet[@]}" "${index_args[@]}" "$TORCH_SPEC"
fi

# --- Horovod (patched build, cached wheel) ---------------------------------------------------
# The wheel's path names its build (versions, flags, patches), so a venv whose Horovod came from
# other patches (an older checkout) gets this one; a cache hit takes a few seconds.
wheel="$(PYTHON="$py" bash "$repo/scripts/setup/build_horovod.sh" | tail -n1)"
if ! "$py" -c 'import horovod.torch' 2>/dev/null || \
        [[ "$(cat "$VENV/.horovod-wheel" 2>/dev/null)" != "$wheel" ]]; then
    log "installing $(basename "$(dirname "$wheel")")"
    "$py" -m pip install "${pip_quiet[@]}" --no-deps --force-reinstall "$wheel"
    echo "$wheel" > "$VENV/.horovod-wheel"
    rm -f "$VENV/.horovod-check-build-ok"
fi

# --- hvdtrain itself -------------------------------------------------------------------------
if [[ "${HVDTRAIN_INSTALL:-editable}" == deps ]]; then
    # Only the requirements, read from pyproject.toml: the layer that holds them is rebuilt when
    # pyproject.toml changes, not when any source file does.
    mapfile -t deps < <("$py" - "$repo/pyproject.toml" "$HVDTRAIN_EXTRAS" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip carries
    from pip._vendor import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = [e for e in sys.argv[2].split(",") if e]
print("\n".join(project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]))
PY
)
    log "installing hvdtrain's dependencies only (extras: $HVDTRAIN_EXTRAS)"
    "$py" -m pip install "${pip_quiet[@]}" "${deps[@]}"
    exit 0
fi
if ! "$py" -m pip show hvdtrain >/dev/null 2>&1 || [[ "$repo/pyproject.toml" -nt "$VENV/.hvdtrain-installed" ]]; then
    log "installing hvdtrain (editable, extras: $HVDTRAIN_EXTRAS)"
    "$py" -m pip install "${pip_quiet[@]}" -e "$repo[$HVDTRAIN_EXTRAS]"
    touch "$VENV/.hvdtrain-installed"
fi

# --- check the build, loudly -----------------------------------------------------------------
# horovodrun --check-build takes about 10 s, so it runs once per Horovod install; the stamp file
# is removed whenever Horovod is (re)installed above.
stamp="$VENV/.horovod-check-build-ok"
if [[ ! -f "$stamp" || "$stamp" -ot "$("$py" -c 'import horovod; print(horovod.__file__)')" ]]; then
    check="$("$VENV/bin/horovodrun" --check-build 2>&1)"
    for want in PyTorch MPI Gloo; do
        if ! grep -Eq "\[X\] $want\b" <<<"$check"; then
            echo "$check" >&2
            log "error: horovodrun --check-build does not list $want; delete the cached wheel under" \
                "${HVDTRAIN_CACHE:-~/.cache/hvdtrain}/wheels and run setup again"
            exit 1
        fi
    done
    echo "$check" > "$stamp"
fi
log "ok: $("$py" -c 'from importlib.metadata import version as v; print("torch", v("torch") + ", horovod", v("horovod"))'), PyTorch + MPI + Gloo"
