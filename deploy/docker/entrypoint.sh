#!/usr/bin/env bash
# The image's entrypoint: run the given command (hvdtrain, mpirun, horovodrun, sshd...) with the
# venv first on PATH. mpirun and horovodrun start remote ranks through ssh with this same PATH,
# so `docker run IMAGE mpirun -np 4 -H a,b hvdtrain train` and MPIJob launchers work unchanged.
set -euo pipefail
export PATH="/opt/venv/bin:${PATH}"
if [[ $# -eq 0 ]]; then
    set -- hvdtrain --help
fi
exec "$@"
