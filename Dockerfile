# syntax=docker/dockerfile:1
# Tessera's two images (docs/deploy.md, "Images and the compose stack"):
#
#   docker build --target tessera       -t tessera:0.1.0 .        the control plane (web, ingest, worker, beat,
#                                                                   migrations) and the router
#   docker build --target tessera-agent -t tessera-agent:0.1.0 .  the agent of a GPU node: the gpu extra
#                                                                   (onnxruntime-gpu) on NVIDIA's CUDA runtime
#
# Both install with scripts/install.sh, the script `make` and CI run, so an image and the tested install
# cannot drift: every pin and hash of requirements/runtime.txt (the runtime part of requirements/lock.txt,
# at the same versions: no test tools in an image), then Tessera itself, in /opt/tessera/.venv under
# the checkout at /opt/tessera (the layout deploy/systemd's units use). The image names, commands, ports
# and health checks are those of deploy/kubernetes and deploy/systemd; tests/deploy/test_images.py holds
# them to it.

# onnxruntime-gpu 1.31.1 (requirements/gpu.txt) is built for CUDA 13 and cuDNN 9 (its `cuda` and `cudnn`
# extras name nvidia-cuda-runtime 13 and nvidia-cudnn-cu13): the CUDA runtime image with cuDNN. It has
# Linux wheels for x86-64 only, so tessera-agent is built for linux/amd64; tessera for amd64 or arm64.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04

# ----------------------------------------------------------------------------------------- tessera-agent
# NVIDIA's CUDA image has Ubuntu's Python (3.12); Tessera requires 3.11: the deadsnakes build of it.
FROM ${CUDA_IMAGE} AS agent-base
# Unpinned apt packages (hadolint DL3008): Ubuntu's and the PPA's versions move with security fixes.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends software-properties-common gpg-agent \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
 && apt-get purge -y --auto-remove software-properties-common gpg-agent \
 && rm -rf /var/lib/apt/lists/*

FROM agent-base AS agent-build
ENV PIP_NO_CACHE_DIR=1
WORKDIR /opt/tessera
COPY . .
RUN PYTHON=python3.11 sh scripts/install.sh /opt/tessera/.venv gpu \
 && .venv/bin/python -m compileall -q controlplane apps engine workers

# The agent runs as root: it enables MIG and creates GPU instances through NVML (CAP_SYS_ADMIN), as the
# privileged DaemonSet of deploy/kubernetes/base/agent.yaml and deploy/systemd/tessera-agent.service run it.
FROM agent-base AS tessera-agent
LABEL org.opencontainers.image.title="tessera-agent" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.description="Tessera's agent of a GPU node: MIG layouts and inference runtimes (onnxruntime-gpu)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=agent-build /opt/tessera /opt/tessera
ENV PATH=/opt/tessera/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /opt/tessera
VOLUME ["/var/lib/tessera-agent"]
EXPOSE 9400
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["python", "deploy/docker/healthcheck.py", "http://127.0.0.1:9400/metrics"]
# What the DaemonSet runs (it reads the token from its Secret first); here TESSERA_CONTROL_PLANE,
# TESSERA_AGENT_TOKEN and TESSERA_ADVERTISE (the address routers reach the runtimes at) come from the
# environment, as in deploy/systemd/agent.env.example.
CMD ["/bin/sh", "-c", "exec tessera agent --backend nvml --bind 0.0.0.0 --advertise \"${TESSERA_ADVERTISE:?set TESSERA_ADVERTISE to the address routers reach this host at}\" --state-dir /var/lib/tessera-agent --metrics-port 9400 --stop-runtimes-on-exit"]

# ----------------------------------------------------------------------------------------------- tessera
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1
WORKDIR /opt/tessera
COPY . .
RUN PYTHON=python3.11 sh scripts/install.sh /opt/tessera/.venv \
 && .venv/bin/python -m compileall -q controlplane apps engine workers

# One image, every control-plane process and the router, each chosen by its command (CMD: the web server).
# Uid and gid 10001, as the manifests' securityContext; what it writes lives under /var/lib/tessera
# (TESSERA_VAR_DIR: media, collected static files) and, for a simulated agent, /var/lib/tessera-agent.
FROM ${PYTHON_IMAGE} AS tessera
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.description="Tessera's control plane (web, ingest, Celery worker and beat, migrations) and router" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tessera \
 && useradd --system --uid 10001 --gid tessera --home-dir /var/lib/tessera --shell /usr/sbin/nologin tessera \
 && install -d -o tessera -g tessera -m 0750 /var/lib/tessera /var/lib/tessera/media /var/lib/tessera/static \
        /var/lib/tessera/credentials /var/lib/tessera-agent
COPY --from=build /opt/tessera /opt/tessera
ENV PATH=/opt/tessera/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=controlplane.settings.production \
    TESSERA_VAR_DIR=/var/lib/tessera \
    TESSERA_MEDIA_ROOT=/var/lib/tessera/media \
    TESSERA_STATIC_ROOT=/var/lib/tessera/static
WORKDIR /opt/tessera
USER 10001:10001
# web (tessera serve), ingest (tessera ingest), router (tessera router: HTTP and gRPC)
EXPOSE 8000 8001 8100 8101
# The web server's /healthz; compose.yaml gives each other process its own check (or none: worker, beat).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "deploy/docker/healthcheck.py", "http://127.0.0.1:8000/healthz"]
CMD ["tessera", "serve", "--bind", "0.0.0.0", "--port", "8000", "--processes", "2"]
