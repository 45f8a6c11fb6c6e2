#!/usr/bin/env bash
# Build the CPU image from the Dockerfile without a Docker engine or an image registry, then run
# `mpirun -np 2 hvdtrain train` and the async command inside it (`make image`; docs/cluster.md,
# "Docker"). Steps, each reused on the next run:
#   1. buildah and mmdebstrap from apt (as setup.sh installs its packages);
#   2. a Debian bookworm base made by mmdebstrap from this host's apt sources, cached as a
#      tarball under $HVDTRAIN_CACHE/image, imported as $BASE_IMAGE: the stand-in for
#      debian:bookworm-slim;
#   3. wheels/ filled with the venv's torch wheel and its cached patched Horovod wheel, so the
#      build compiles nothing and downloads only what PyPI serves (wheels/README.md);
#   4. `buildah bud --target cpu` (vfs storage, chroot isolation, layer cache), as
#      `docker build --target cpu --build-arg CPU_IMAGE=$BASE_IMAGE .` would;
#   5. both runs as the image's user, each under a timeout; a failed run fails the script.
# Needs root (buildah's vfs storage and chroot isolation) and about 20 GB of disk (vfs keeps each
# layer as a full copy). --no-run stops after the build; --prune removes the layer cache, the base
# and the image at the end (the next run then takes as long as the first).
#
# Environment:
#   IMAGE        the image's name (default hvdtrain:cpu)
#   BASE_IMAGE   the imported base's name (default localhost/hvdtrain-base:bookworm-slim)
#   VENV         the venv whose torch and Horovod go into the image (default: .venv)
#   HVDTRAIN_EXTRAS  the extras installed in the image (the Dockerfile's default: dev,mlflow,wandb)
#   RUN_TIMEOUT  seconds for each run inside the image (default 600)
#   DEBIAN_MIRROR  a Debian mirror's URL for the base (default: this host's apt sources)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
IMAGE="${IMAGE:-hvdtrain:cpu}"
BASE_IMAGE="${BASE_IMAGE:-localhost/hvdtrain-base:bookworm-slim}"
VENV="${VENV:-$repo/.venv}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
cache="${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}/image"
base_tar="$cache/debian-bookworm-minbase.tar"
buildah=(buildah --storage-driver vfs)
export BUILDAH_ISOLATION=chroot

log() { echo "[image] $*" >&2; }
die() { log "error: $*"; exit 1; }

run_image=1 prune=0
for arg in "$@"; do
    case "$arg" in
        --no-run) run_image=0 ;;
        --prune) prune=1 ;;
        *) die "unknown argument '$arg' (takes --no-run, --prune)" ;;
    esac
done

install_tools() {
    local missing=()
    command -v buildah >/dev/null || missing+=(buildah)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    ((${#missing[@]})) || return 0
    log "installing from apt: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Where the base's packages come from: DEBIAN_MIRROR (a mirror's URL) when set, else the sources
# this machine's own apt uses (mmdebstrap reads a sources file as its mirror argument), so the
# image takes its packages from wherever this host can reach them.
debian_sources() {
    if [[ -n "${DEBIAN_MIRROR:-}" ]]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local file
    for file in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
        if [[ -s "$file" ]]; then
            echo "$file"
            return
        fi
    done
    log "error: this machine's apt has no Debian sources; set DEBIAN_MIRROR to a mirror's URL"
    return 1
}

# The base: Debian's minbase variant, without docs, man pages and locales (as the slim image).
make_base() {
    if [[ ! -f "$base_tar" ]]; then
        log "making the Debian bookworm base with mmdebstrap (about a minute)"
        mkdir -p "$cache"
        mmdebstrap --quiet --variant=minbase \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
            bookworm "$cache/.partial.tar" "$(debian_sources)"
        mv "$cache/.partial.tar" "$base_tar"   # never a half-written tarball in the cache
    fi
    # The image carries the tarball's checksum, so a remade tarball is imported again.
    local sum have ctr
    sum="$(sha256sum "$base_tar" | cut -c1-16)"
    have="$("${buildah[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "hvdtrain.base"}}' \
        "$BASE_IMAGE" 2>/dev/null || true)"
    [[ "$have" == "$sum" ]] && return 0
    log "importing the base as $BASE_IMAGE"
    ctr="$("${buildah[@]}" from scratch)"
    "${buildah[@]}" add "$ctr" "$base_tar" / >/dev/null
    "${buildah[@]}" config --label "hvdtrain.base=$sum" --cmd bash \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    "${buildah[@]}" commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
}

# torch: the wheel of the venv's version, from this machine's pip sources (a find-links folder or
# a cache); Horovod: the wheel setup.sh installed, under the key build_horovod.sh looks for.
fill_wheels() {
    local py="$VENV/bin/python" torch_version wheel key
    [[ -x "$py" ]] || die "no venv at $VENV: run make setup first (or set VENV)"
    torch_version="$("$py" -c 'import torch; print(torch.__version__)')"
    mkdir -p "$repo/wheels"
    "$py" -m pip download --quiet --no-deps -d "$repo/wheels" "torch==$torch_version"
    wheel="$(PYTHON="$py" bash "$repo/scripts/setup/build_horovod.sh" 2>/dev/null | tail -n1)"
    key="$(basename "$(dirname "$wheel")")"
    mkdir -p "$repo/wheels/$key"
    cmp -s "$wheel" "$repo/wheels/$key/$(basename "$wheel")" || cp "$wheel" "$repo/wheels/$key/"
    TORCH_SPEC="torch==$torch_version"
    log "wheels: torch $torch_version, $key"
}

# Where this machine's pip trusts a certificate of its own (a proxy that re-signs PyPI's), the
# build's pip gets it too: a pip.conf and the certificate mounted at /etc/xdg/pip during each RUN,
# never written into a layer.
pip_tls_mount() {
    local cert
    cert="$("$VENV/bin/python" -m pip config list 2>/dev/null | sed -n "s/^[^ =]*\.cert='\(.*\)'$/\1/p" |
        head -n1)"
    [[ -n "$cert" && -f "$cert" ]] || return 0
    tls_dir="$(mktemp -d)"
    trap 'rm -rf "$tls_dir" "$bud_log"' EXIT
    cp "$cert" "$tls_dir/ca.pem"
    printf '[global]\ncert = /etc/xdg/pip/ca.pem\n' > "$tls_dir/pip.conf"
    chmod -R a+rX "$tls_dir"
    mounts+=(--volume "$tls_dir:/etc/xdg/pip:ro")
    log "pip in the build trusts $cert, as pip here does"
}

build() {
    local extras=() mounts=() start=$SECONDS
    [[ -n "${HVDTRAIN_EXTRAS:-}" ]] && extras=(--build-arg "HVDTRAIN_EXTRAS=$HVDTRAIN_EXTRAS")
    pip_tls_mount
    log "building $IMAGE (buildah bud --target cpu)"
    # docker format: the OCI format drops SHELL, and the Dockerfile's RUNs rely on its pipefail.
    "${buildah[@]}" bud --isolation chroot --format docker --layers --force-rm --pull=never \
        --target cpu --build-arg "CPU_IMAGE=$BASE_IMAGE" --build-arg "TORCH_SPEC=$TORCH_SPEC" \
        "${extras[@]}" "${mounts[@]}" -t "$IMAGE" -f "$repo/Dockerfile" "$repo" | tee "$bud_log"
    drop_stale_layers
    build_s=$((SECONDS - start))
    size="$("${buildah[@]}" images --format '{{.Size}}' "$IMAGE" | head -n1)"
    log "built $IMAGE in ${build_s} s; size $size"
}

# The layer cache keeps every build's layers, each a full copy under vfs (GBs each): keep this
# build's (the "--> ID" lines of its log, cache hits included), the next build's cache, and
# remove the other unnamed ones, children before parents (newest first, twice over).
drop_stale_layers() {
    local keep id name pass
    keep="$(sed -n 's/^--> \([0-9a-f]\{11\}\)$/\1/p' "$bud_log")"
    for pass in 1 2; do
        while read -r id name; do
            [[ "$name" == "<none>" ]] && ! grep -qx "${id:0:11}" <<<"$keep" || continue
            "${buildah[@]}" rmi "$id" >/dev/null 2>&1 || true
        done < <("${buildah[@]}" images -a --format '{{.ID}} {{.Name}}')
    done
}

# One command inside the image, as its user, in a container of its own; the run's last lines and
# its "done:" line are shown.
run_in_image() {
    local name="$1" ctr out rc=0
    shift
    ctr="$("${buildah[@]}" from --pull=never --quiet "$IMAGE")"
    out="$(mktemp)"
    log "running in $IMAGE: $*"
    # The timeout inside the container ends mpirun, which ends its ranks; the one outside is the
    # backstop should buildah itself hang.
    timeout --kill-after=30 $((RUN_TIMEOUT + 120)) "${buildah[@]}" run --user 1000:1000 \
        --env HOME=/home/hvdtrain "$ctr" -- timeout --kill-after=30 "$RUN_TIMEOUT" "$@" \
        >"$out" 2>&1 || rc=$?
    "${buildah[@]}" rm "$ctr" >/dev/null
    tail -n 5 "$out" >&2
    results+=("$name: $(grep -o 'done: [^,;]*' "$out" | tail -n1 || true) (exit $rc)")
    rm -f "$out"
    if ((rc != 0)); then
        failed=1
    fi
}

bud_log="$(mktemp)"
trap 'rm -f "$bud_log"' EXIT
[[ $(id -u) -eq 0 ]] || die "run as root (buildah's vfs storage and chroot isolation need it)"
install_tools
total=$SECONDS
make_base
fill_wheels
build
results=() failed=0
if ((run_image)); then
    run_in_image sync mpirun -np 2 hvdtrain train
    # 3 ranks (a server and two workers) on a machine that may have fewer cores
    run_in_image async mpirun --oversubscribe -np 3 hvdtrain train --mode async
fi
if ((prune)); then
    log "removing $IMAGE, its base and the layer cache"
    "${buildah[@]}" rmi --force "$IMAGE" "$BASE_IMAGE" >/dev/null || true
    "${buildah[@]}" rmi --prune >/dev/null || true
fi
log "summary: build ${build_s} s, image $size, all steps $((SECONDS - total)) s"
for line in "${results[@]}"; do log "  $line"; done
exit "$failed"
