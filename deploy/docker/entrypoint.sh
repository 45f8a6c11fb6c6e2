#!/usr/bin/env bash
# The image's entrypoint: run the given command (hvdtrain, mpirun, horovodrun, sshd...) with the
# venv first on PATH. A remote rank starts through ssh, whose session has the PATH of the peer's
# sshd, not this one: mpirun's `-x PATH` passes this one on (the deploy files' launch lines give
# it), and the image's sshd sets the venv's PATH in its sessions too (add_user.sh, SetEnv).
set -euo pipefail
export PATH="/opt/venv/bin:${PATH}"
if [[ $# -eq 0 ]]; then
    set -- hvdtrain --help
fi
exec "$@"
