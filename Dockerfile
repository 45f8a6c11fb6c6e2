# hvdtrain images: a GPU target (CUDA + NCCL, Horovod built with HOROVOD_GPU_OPERATIONS=NCCL) and
# a CPU target. Both install through scripts/setup/setup.sh, the same script `make setup` runs, so
# the Horovod patch and build flags have one source of truth.
#
#   docker build --target gpu -t hvdtrain:gpu .
#   docker build --target cpu -t hvdtrain:cpu --build-arg TORCH_INDEX_URL=<torch CPU wheel index> .
#   docker run --rm hvdtrain:cpu mpirun -np 2 hvdtrain train
#
# TORCH_SPEC / TORCH_INDEX_URL choose the torch build (PyPI's Linux torch wheels are CUDA builds;
# torch 2.5.1 is built for CUDA 12.4, the base images' CUDA: change them together;
# point TORCH_INDEX_URL at a CPU wheel index for a small CPU image). The venv lives in /opt/venv
# and the source in /opt/hvdtrain; both are copied into a runtime stage without compilers.
# The build stages install torch, Horovod and the requirements from pyproject.toml, the setup
# scripts and wheels/ alone, then copy the source: a change to the source reuses that layer.
# wheels/ (empty in git) holds local wheels, torch and a patched Horovod under its cache key, that
# setup.sh takes before any index and instead of building Horovod: scripts/image/build.sh fills
# it from the machine that builds, where no registry or torch index can be reached.
# HVDTRAIN_EXTRAS: the extras installed with hvdtrain (the --tracker libraries by default;
# --build-arg HVDTRAIN_EXTRAS=dev leaves MLflow and W&B out, about 210 MB).

ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
ARG CPU_IMAGE=debian:bookworm-slim

# --- GPU build: Horovod with NCCL, MPI and Gloo -----------------------------------------------
FROM ${CUDA_DEVEL_IMAGE} AS gpu-build
ARG TORCH_SPEC=torch==2.5.1
ARG TORCH_INDEX_URL=
ARG HVDTRAIN_EXTRAS=dev,mlflow,wandb
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Versions come from the distribution release the base image pins; setup.sh installs the rest.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/hvdtrain
COPY pyproject.toml /opt/hvdtrain/
COPY scripts/setup /opt/hvdtrain/scripts/setup
COPY wheels /opt/hvdtrain/wheels
RUN VENV=/opt/venv HVDTRAIN_EXTRAS="${HVDTRAIN_EXTRAS}" HOROVOD_GPU_OPERATIONS=NCCL HVDTRAIN_INSTALL=deps \
    TORCH_SPEC="${TORCH_SPEC}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" \
    bash scripts/setup/setup.sh \
    && rm -rf /root/.cache/pip
COPY . /opt/hvdtrain
RUN VENV=/opt/venv HVDTRAIN_EXTRAS="${HVDTRAIN_EXTRAS}" HOROVOD_GPU_OPERATIONS=NCCL \
    TORCH_SPEC="${TORCH_SPEC}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" \
    bash scripts/setup/setup.sh \
    && rm -rf /root/.cache /opt/hvdtrain/wheels

# --- CPU build --------------------------------------------------------------------------------
FROM ${CPU_IMAGE} AS cpu-build
ARG TORCH_SPEC=torch==2.5.1
ARG TORCH_INDEX_URL=
ARG HVDTRAIN_EXTRAS=dev,mlflow,wandb
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/hvdtrain
COPY pyproject.toml /opt/hvdtrain/
COPY scripts/setup /opt/hvdtrain/scripts/setup
COPY wheels /opt/hvdtrain/wheels
RUN VENV=/opt/venv HVDTRAIN_EXTRAS="${HVDTRAIN_EXTRAS}" HVDTRAIN_INSTALL=deps \
    TORCH_SPEC="${TORCH_SPEC}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" \
    bash scripts/setup/setup.sh \
    && rm -rf /root/.cache/pip
COPY . /opt/hvdtrain
RUN VENV=/opt/venv HVDTRAIN_EXTRAS="${HVDTRAIN_EXTRAS}" \
    TORCH_SPEC="${TORCH_SPEC}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" \
    bash scripts/setup/setup.sh \
    && rm -rf /root/.cache /opt/hvdtrain/wheels

# --- runtime stages: MPI, ssh for MPIJob/multi-host launches, a non-root user -----------------
FROM ${CUDA_RUNTIME_IMAGE} AS gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 openmpi-bin libopenmpi3 \
       openssh-client openssh-server \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/docker/entrypoint.sh /usr/local/bin/hvdtrain-entrypoint
COPY deploy/docker/add_user.sh /tmp/add_user.sh
RUN bash /tmp/add_user.sh && rm /tmp/add_user.sh
ENV PATH=/opt/venv/bin:${PATH} PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /home/hvdtrain
ENTRYPOINT ["/usr/local/bin/hvdtrain-entrypoint"]
CMD ["hvdtrain", "--help"]
# The venv and the source last: a builder that stores each layer as a full copy (buildah's vfs)
# then copies them twice, not once per instruction above.
COPY --from=gpu-build /opt/venv /opt/venv
COPY --from=gpu-build /opt/hvdtrain /opt/hvdtrain

FROM ${CPU_IMAGE} AS cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 openmpi-bin libopenmpi3 \
       openssh-client openssh-server \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/docker/entrypoint.sh /usr/local/bin/hvdtrain-entrypoint
COPY deploy/docker/add_user.sh /tmp/add_user.sh
RUN bash /tmp/add_user.sh && rm /tmp/add_user.sh
ENV PATH=/opt/venv/bin:${PATH} PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /home/hvdtrain
ENTRYPOINT ["/usr/local/bin/hvdtrain-entrypoint"]
CMD ["hvdtrain", "--help"]
# The venv and the source last: a builder that stores each layer as a full copy (buildah's vfs)
# then copies them twice, not once per instruction above.
COPY --from=cpu-build /opt/venv /opt/venv
COPY --from=cpu-build /opt/hvdtrain /opt/hvdtrain
