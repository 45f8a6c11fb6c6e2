#!/usr/bin/env bash
# Build step of the runtime images: the non-root user that runs training, and an sshd it can run
# by itself (port 2222, host keys in its home) for mpirun/horovodrun and Kubeflow MPIJob workers.
set -euo pipefail
useradd --create-home --uid 1000 --shell /bin/bash hvdtrain
home=/home/hvdtrain
mkdir -p "$home/.ssh" "$home/.sshd"
ssh-keygen -q -t ed25519 -N "" -f "$home/.sshd/host_ed25519_key"
cat > "$home/.sshd_config" <<CONFIG
Port 2222
HostKey $home/.sshd/host_ed25519_key
PidFile $home/.sshd/sshd.pid
AuthorizedKeysFile $home/.ssh/authorized_keys
PasswordAuthentication no
UsePAM no
# Kubeflow's MPIJob mounts ~/.ssh from a Secret, whose files' modes sshd's strict checks refuse
# (the MPI operator's own images turn them off for that reason)
StrictModes no
# An ssh session's PATH is sshd's default, without the venv: a rank started on this host through
# it (mpirun -H a,b without -x PATH) would not find hvdtrain. Not tested here (no sshd).
SetEnv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CONFIG
# ssh clients in the image reach their peers' sshd on port 2222 without host-key prompts. This
# lives in /etc, not ~/.ssh, because Kubeflow's MPIJob mounts its keys over ~/.ssh.
mkdir -p /etc/ssh/ssh_config.d
cat > /etc/ssh/ssh_config.d/hvdtrain.conf <<CONFIG
Host *
    Port 2222
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONFIG
chown -R hvdtrain:hvdtrain "$home"
chmod 700 "$home/.ssh"
chmod +x /usr/local/bin/hvdtrain-entrypoint
