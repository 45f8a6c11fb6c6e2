"""The image build without a Docker engine (scripts/image/build.sh, `make image`): its shell
parses, the Dockerfile's build stages take local wheels from wheels/ before the source and leave
them out of the runtime image, and build_horovod.sh uses a wheel from wheels/<key>/ instead of
building. The build itself is too slow for the suite: docs/testing.md says how to run it."""

import hashlib
import os
import re
import shutil
import subprocess

from launch import REPO
from test_deploy import stages

SETUP = REPO / "scripts" / "setup"


def test_build_script_parses_and_make_image_runs_it():
    script = REPO / "scripts" / "image" / "build.sh"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^image: setup\n\tbash scripts/image/build.sh$", makefile, re.M)


def test_build_stages_install_from_wheels_before_the_source_and_drop_them():
    built = stages()
    for stage in ("gpu-build", "cpu-build"):
        steps = built[stage]
        copy_wheels = steps.index(("COPY", "wheels /opt/hvdtrain/wheels"))
        setups = [n for n, (i, a) in enumerate(steps) if i == "RUN" and "setup.sh" in a]
        copy_source = steps.index(("COPY", ". /opt/hvdtrain"))
        # deps first (the layer a source change reuses), then the source and hvdtrain itself
        assert copy_wheels < setups[0] < copy_source < setups[1], stage
        assert "HVDTRAIN_INSTALL=deps" in steps[setups[0]][1], stage
        assert "HVDTRAIN_INSTALL" not in steps[setups[1]][1], stage
        assert "rm -rf /root/.cache /opt/hvdtrain/wheels" in steps[setups[1]][1], stage
    # the folder is in git (so COPY finds it) but its wheels are not; the context carries them
    assert (REPO / "wheels" / "README.md").is_file()
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "wheels/*" in ignored and "!wheels/README.md" in ignored
    assert not any(line.strip("/").startswith("wheels")
                   for line in (REPO / ".dockerignore").read_text().splitlines())


def _fake_repo(tmp_path):
    """A copy of scripts/setup with a stand-in interpreter: its torch is 9.9 and pip fails."""
    shutil.copytree(SETUP, tmp_path / "repo" / "scripts" / "setup")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\ncase \"$*\" in *torch.__version__*) echo py3.11-torch9.9;; "
                      "*) echo 'no download here' >&2; exit 1;; esac\n")
    python.chmod(0o755)
    patches = sorted(SETUP.glob("horovod-0.28.1-*.patch"))
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in patches)).hexdigest()[:8]
    key = f"horovod0.28.1-py3.11-torch9.9-gpu_none-{digest}"
    return tmp_path / "repo", python, key


def _build_horovod(repo, python, cache):
    env = {**os.environ, "PYTHON": str(python), "HVDTRAIN_CACHE": str(cache)}
    env.pop("HOROVOD_GPU_OPERATIONS", None)
    return subprocess.run(["bash", str(repo / "scripts" / "setup" / "build_horovod.sh")],
                          capture_output=True, text=True, env=env, timeout=60)


def test_build_horovod_takes_the_wheel_from_the_wheels_folder(tmp_path):
    repo, python, key = _fake_repo(tmp_path)
    local = repo / "wheels" / key / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"wheel")
    proc = _build_horovod(repo, python, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(local)
    assert "local wheel" in proc.stderr
    # a machine with both keeps its cache's wheel, the one its venv records
    cached = tmp_path / "cache" / "wheels" / key / local.name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"wheel")
    proc = _build_horovod(repo, python, tmp_path / "cache")
    assert proc.stdout.strip().splitlines()[-1] == str(cached)


def test_build_horovod_ignores_a_wheel_of_another_build(tmp_path):
    repo, python, key = _fake_repo(tmp_path)
    other = repo / "wheels" / key.replace("torch9.9", "torch9.8") / "horovod-0.28.1-x.whl"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"wheel")
    proc = _build_horovod(repo, python, tmp_path / "cache")
    assert proc.returncode != 0 and "cache miss" in proc.stderr  # it went on to build
