# syntax=docker/dockerfile:1
#
# BayesGate prediction service: `bayesgate serve`, configured by BAYESGATE_* environment variables.
#
#   docker build -t bayesgate:gpu .                           # CUDA build (the default)
#   docker build -t bayesgate:cpu --build-arg VARIANT=cpu .   # CPU-only build, no CUDA libraries
#   docker build -t bayesgate:gpu-ray --build-arg EXTRAS=ray .  # + Ray Serve (docs/ray.md)
#
# Needs BuildKit (the default builder since Docker 23): it builds only the stages that VARIANT
# selects, so the CPU build never downloads the CUDA wheels.
#
# Why nvidia/cuda:13.0.2-base-ubuntu24.04: the torch==2.13.0 wheel on PyPI (manylinux_2_28_x86_64)
# is built against CUDA 13.0 — its metadata requires cuda-toolkit==13.0.3 (cuBLAS, cuFFT, cuRAND,
# cuSOLVER, cuSPARSE, NVRTC, …) and nvidia-cudnn-cu13==9.20.0.48 from PyPI. pip installs those
# libraries into the venv and torch loads them from there, so the image needs no CUDA libraries of
# its own: the "base" flavour (cudart plus the NVIDIA container environment) is enough, and its
# NVIDIA_REQUIRE_CUDA=cuda>=13.0 makes the NVIDIA container toolkit refuse a host whose driver is
# too old for CUDA 13.0 (driver >= 580) instead of torch silently finding no GPU. The "runtime" and
# "cudnn-runtime" flavours would add a second, never-loaded copy of the same libraries (~2-3 GB).
# Keep the base image's CUDA major.minor equal to torch's: bump TORCH_VERSION and CUDA_IMAGE
# together.

ARG VARIANT=gpu
ARG TORCH_VERSION=2.13.0
# The native front end (BAYESGATE_NATIVE_PORT): Rust, std only, built offline in its own stage.
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04
ARG CPU_IMAGE=ubuntu:24.04

# ---- the native front end's library (service/native_front: no crates, so no registry access) --
# Built against Debian 12's glibc (2.36); the Ubuntu 24.04 runtime (2.39) runs it. The image sets
# BAYESGATE_NATIVE_LIBRARY to it, so `serve --native-port` needs no cargo in the container.
FROM ${RUST_IMAGE} AS native
COPY service/native_front/ /src/native_front/
WORKDIR /src/native_front
RUN cargo build --release --offline --lib \
    && mkdir -p /out \
    && cp target/release/libbgfront.so /out/libbgfront.so

# ---- operating system per variant (both Ubuntu 24.04, so both get the same Python 3.12) --------
FROM ${CUDA_IMAGE} AS os-gpu
ENV BAYESGATE_DEVICE=cuda

FROM ${CPU_IMAGE} AS os-cpu
ENV BAYESGATE_DEVICE=cpu

# ---- Python runtime shared by the builder and the final image (same interpreter path) ----------
# (DL3006 wants a tag: os-gpu / os-cpu are stages of this file, not images.)
# hadolint ignore=DL3006
FROM os-${VARIANT} AS python-base
ARG DEBIAN_FRONTEND=noninteractive
# Unpinned on purpose: the base image's tag fixes the release (Python 3.12 on 24.04), and each
# rebuild should pick up that release's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*

# ---- builder: a venv with torch, the project and its default model -----------------------------
FROM python-base AS builder
ARG DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
# Every pip install below takes the lock: each package at one exact version, so that two builds
# of one commit install the same packages (deploy/lock_image.py writes it; torch itself is pinned
# by TORCH_VERSION). Copied before torch so that torch's own dependencies (the CUDA libraries,
# sympy, networkx, ...) are locked too; a new lock therefore rebuilds the torch layer.
COPY deploy/image-constraints.txt /src/deploy/image-constraints.txt

# torch first, in its own layer: the largest download, unchanged by edits to the project (rebuilt
# when TORCH_VERSION or the lock changes).
FROM builder AS torch-gpu
ARG TORCH_VERSION
RUN pip install --no-cache-dir --constraint /src/deploy/image-constraints.txt \
    "torch==${TORCH_VERSION}"

FROM builder AS torch-cpu
ARG TORCH_VERSION
# The CPU index carries the same release with the local label +cpu and no CUDA dependencies;
# torch's other dependencies may come from PyPI at their locked versions (the CPU index need not
# carry every release). PyPI cannot serve a "+cpu" version (it refuses local version labels), so
# torch itself comes from the CPU index only.
RUN pip install --no-cache-dir --constraint /src/deploy/image-constraints.txt \
    --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple \
    "torch==${TORCH_VERSION}+cpu"

# hadolint ignore=DL3006
FROM torch-${VARIANT} AS venv
# Optional extras of the package, comma-separated: "ray" adds Ray Serve (`bayesgate serve --ray`,
# or the image as a Ray cluster node: `--entrypoint ray ... start --head --block`).
ARG EXTRAS=""
COPY pyproject.toml README.md /src/
COPY bayesgate/ /src/bayesgate/
COPY models/ /src/models/
COPY attacks/ /src/attacks/
COPY service/ /src/service/
# A regular (non-editable) install: the package and its data, models/pretrained/ included, go into
# site-packages; the pinned torch is already satisfied. Then fail the build unless the bundled
# default model loads (weights sha256-checked, calibration.json present and tied to them), link it
# at a fixed path, and drop pip: the final image installs nothing. (Run from /, not /src, so that
# `python -c` imports the installed package rather than the source tree.)
RUN pip install --no-cache-dir --constraint /src/deploy/image-constraints.txt \
        "/src${EXTRAS:+[${EXTRAS}]}" \
    && python -c "from bayesgate.service.served_model import load_served_model as load; from bayesgate.service.settings import DEFAULT_MODEL_DIR as d; load(d, 'cpu'); print('bundled model OK:', d)" \
    && mkdir -p /opt/bayesgate \
    && ln -s "$(python -c 'from bayesgate.service.settings import DEFAULT_MODEL_DIR as d; print(d)')" /opt/bayesgate/default-model \
    && pip uninstall -y pip

# ---- final image: Python, the venv, the health check; no compilers, no pip, no caches ----------
FROM python-base AS runtime
ARG VARIANT
LABEL org.opencontainers.image.title="bayesgate" \
      org.opencontainers.image.description="Predictions with MC-dropout uncertainty and a calibrated adversarial-input flag" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.bayesgate.variant="${VARIANT}"
RUN groupadd --system --gid 10001 bayesgate \
    && useradd --system --uid 10001 --gid bayesgate --create-home --home-dir /home/bayesgate \
        --shell /usr/sbin/nologin bayesgate
COPY --from=venv /opt/venv /opt/venv
COPY --from=venv /opt/bayesgate /opt/bayesgate
COPY --from=native /out/libbgfront.so /opt/bayesgate/native/libbgfront.so
COPY deploy/healthcheck.py /opt/bayesgate/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BAYESGATE_HOST=0.0.0.0 \
    BAYESGATE_PORT=8000 \
    BAYESGATE_MODEL_DIR=/opt/bayesgate/default-model \
    BAYESGATE_NATIVE_LIBRARY=/opt/bayesgate/native/libbgfront.so \
    BAYESGATE_DEMO=false
WORKDIR /home/bayesgate
USER 10001:10001
# The service. With BAYESGATE_NATIVE_PORT=8002 the native front end listens on 8002 too (publish it).
EXPOSE 8000
# Readiness, not liveness: healthy once the model is loaded and a warm-up batch has run.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/opt/venv/bin/python", "/opt/bayesgate/healthcheck.py"]
ENTRYPOINT ["bayesgate"]
CMD ["serve"]
