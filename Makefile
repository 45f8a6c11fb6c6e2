# The two commands: `make demo` (set up, then compare sync and async on digits) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 2
# Open MPI refuses to run as root without these (CI and containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: setup demo train test bench bench-ps bench-pipeline gpu-bundle gpu-check image clean

setup:
	bash scripts/setup/setup.sh

demo: setup
	$(VENV)/bin/hvdtrain compare --workers $(NP) --sweep-workers 2,8 --sweep-seeds 1

train: setup
	$(VENV)/bin/horovodrun -np $(NP) --gloo $(VENV)/bin/hvdtrain train --dataset digits --model mlp --epochs 20

test: setup
	$(PY) -m pytest -v -rs --durations=40

bench: setup
	$(PY) scripts/bench_sync.py --launcher mpi
	$(PY) scripts/bench_sync.py --launcher gloo

bench-ps: setup
	$(PY) scripts/bench_ps.py

bench-pipeline: setup
	$(PY) scripts/bench_pipeline.py

# What scripts/gpu/check.sh needs on a device machine with no network (docs/gpu.md, "The GPU
# check"): made here, where PyPI is reachable, into build/gpu-bundle (ignored by git).
gpu-bundle:
	bash scripts/gpu/make_bundle.sh

gpu-check:
	bash scripts/gpu/check.sh

# The CPU image from the Dockerfile with buildah (no Docker engine or registry needed), then a
# sync and an async run inside it (docs/cluster.md, "Docker"). Needs root.
image: setup
	bash scripts/image/build.sh

clean:
	rm -rf runs .pytest_cache
