#!/usr/bin/env bash
# The Kubernetes manifests' command: wait until every worker answers, check the cluster with
# `hvdtrain doctor` on the job's own launcher line, hosts and run folder, and only then start the
# job, in this process's place (exec: mpirun, or `hvdtrain run`, stays the container's first
# process, which the manifests' notes on preemption rely on).
#
#   bash first_launch.sh mpirun -np 8 [mpirun flags] hvdtrain train [train flags]
#   bash first_launch.sh hvdtrain run mpirun -np 4 [mpirun flags] hvdtrain train [train flags]
#
# A launcher that starts before its workers' sshd listens fails at once (MPIJob's
# WaitForWorkersReady waits for the pods, not for sshd); a bad host shows up as a hang or a
# traceback from inside Open MPI. Here the first is waited out and the second is one line per
# problem, with its fix, before any training starts. The doctor's exit 2 (NOT fit) ends this
# container with 2 and the doctor's lines as its termination message (kubectl describe pod).
#
# WORKER_WAIT_SECONDS  how long the workers of the hostfile may take to answer ssh (300)
# DOCTOR_TIMEOUT       the doctor's --timeout, in seconds (90)
# DOCTOR               0 skips the doctor (the wait still runs)
# TERMINATION_LOG      where Kubernetes reads the termination message (/dev/termination-log)
set -uo pipefail

WORKER_WAIT_SECONDS="${WORKER_WAIT_SECONDS:-300}"
DOCTOR_TIMEOUT="${DOCTOR_TIMEOUT:-90}"
TERMINATION_LOG="${TERMINATION_LOG:-/dev/termination-log}"

say() { echo "hvdtrain first launch: $*" >&2; }

# The launcher line: the words before the program's `hvdtrain`, after a leading `hvdtrain run`.
words=("$@")
start=0
if [[ "${words[0]:-}" == hvdtrain && "${words[1]:-}" == run ]]; then
    start=2
fi
launcher=()
run_dir=runs
found=""
for ((i = start; i < ${#words[@]}; i++)); do
    if [[ -z "$found" && "${words[i]}" == hvdtrain ]]; then
        found=$i
    elif [[ -z "$found" ]]; then
        launcher+=("${words[i]}")
    elif [[ "${words[i]}" == --run-dir ]]; then
        run_dir="${words[i + 1]:-runs}"
    elif [[ "${words[i]}" == --run-dir=* ]]; then  # argparse takes both forms
        run_dir="${words[i]#--run-dir=}"
    fi
done
if [[ -z "$found" || ${#launcher[@]} -eq 0 ]]; then
    say "expected a launcher line and hvdtrain's command, e.g. 'mpirun -np 8 hvdtrain train" \
        "...'; got: $*"
    exit 2
fi

# Every worker of the hostfile (MPIJob's, or Open MPI's default) answers ssh, within the wait.
hostfile="${OMPI_MCA_orte_default_hostfile:-/etc/mpi/hostfile}"
if [[ -f "$hostfile" ]]; then
    deadline=$((SECONDS + WORKER_WAIT_SECONDS))
    for host in $(awk '!/^[[:space:]]*(#|$)/ {print $1}' "$hostfile"); do
        until ssh -o BatchMode=yes -o ConnectTimeout=5 "$host" true 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                say "worker $host did not answer ssh within $WORKER_WAIT_SECONDS s; see" \
                    "'kubectl describe pod' and 'kubectl logs' of that worker (its sshd, its" \
                    "image, its node), or raise WORKER_WAIT_SECONDS"
                exit 1  # a retry may find it started: counted against backoffLimit
            fi
            sleep 2
        done
    done
    say "every worker of $hostfile answers"
fi

if [[ "${DOCTOR:-1}" != 0 ]]; then
    json="$run_dir/doctor.json"
    output=$(mktemp)
    hvdtrain doctor --json "$json" --run-dir "$run_dir" --timeout "$DOCTOR_TIMEOUT" \
        "${launcher[@]}" 2>&1 | tee "$output"
    status=${PIPESTATUS[0]}
    if ((status != 0)); then
        if ((status == 2)); then
            say "the doctor found this cluster NOT fit (or refused its input); training was" \
                "not started. Fix what it names above (its measurements: $json) and start the" \
                "job again"
        else
            say "the doctor itself failed (exit $status); training was not started"
        fi
        # Kubernetes keeps at most 4 KiB of the message: the doctor's problem lines first.
        { grep '^doctor: ' "$output" || tail -n 20 "$output"; } | tail -c 4000 \
            >"$TERMINATION_LOG" 2>/dev/null || true
        rm -f "$output"
        exit "$status"
    fi
    rm -f "$output"
fi

exec "$@"
