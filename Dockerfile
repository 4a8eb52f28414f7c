# syntax=docker/dockerfile:1
# Switchyard images, one file, four targets (README "Deploy"):
#   gateway      (the last stage, so the default) the base install: `switchyard serve`, no torch, no onnx
#   gateway-gpu  the same with onnxruntime-gpu and its CUDA 12 / cuDNN 9 libraries, for the embedded backend on a GPU
#   exporter     `pip install '.[export]'` (torch CPU): one-shot jobs that write versions into the repository volume
#   loadtest     the official locust image plus the clients the locustfile imports; loadtests/ is mounted at run time
# Every Python stage builds its venv in /opt/venv of a build stage; the final stages copy only that venv (which holds
# the installed packages) onto a fresh slim base, so no compiler, pip cache or source tree ships.
# tests/deploy/test_dockerfile_stages.py checks these rules; tests/deploy/test_base_install.py runs the gateway's
# install command exactly as written below.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG LOCUST_IMAGE=locustio/locust:2.47.0

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services services
COPY exporter exporter
COPY examples examples
# The base install (README "Install"): the gateway, no torch, onnx or onnxscript.
RUN python -m pip install --quiet /src

FROM build AS build-gpu
# `make install-gpu`'s lines (docs/install.md, GPU nodes): onnxruntime-gpu provides the same module as onnxruntime, so
# the CPU wheel goes first; the cuda/cudnn extras bring the CUDA 12 and cuDNN 9 runtime libraries as wheels (no CUDA
# base image needed). The check fails the build when onnxruntime offers no CUDAExecutionProvider; that the builder
# has no GPU it only reports.
RUN python -m pip install --quiet '/src[gpu]' \
    && python -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu \
    && python -m pip install --quiet 'onnxruntime-gpu[cuda,cudnn]>=1.20' \
    && python -m services.gateway.backends.nvml

FROM ${PYTHON_IMAGE} AS build-export
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services services
COPY exporter exporter
COPY examples examples
# The +cpu label matches only PyTorch's CPU wheel: pip can never pull the CUDA build from PyPI instead.
RUN python -m pip install --quiet --extra-index-url https://download.pytorch.org/whl/cpu \
    'torch==2.13.0+cpu' '/src[export]'

FROM ${PYTHON_IMAGE} AS runtime
# A fixed uid/gid, so volumes and Kubernetes' runAsUser can name it.
RUN groupadd --system --gid 10001 switchyard \
    && useradd --system --uid 10001 --gid switchyard --home-dir /home/switchyard --create-home switchyard \
    && mkdir -p /models /var/lib/switchyard \
    && chown switchyard:switchyard /var/lib/switchyard
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SWITCHYARD_HOST=0.0.0.0 \
    SWITCHYARD_PORT=8000 \
    SWITCHYARD_GRPC_PORT=8001 \
    SWITCHYARD_REPOSITORY=/models \
    SWITCHYARD_BACKEND=embedded \
    SWITCHYARD_STATE_PATH=/var/lib/switchyard/routing.json
WORKDIR /home/switchyard
USER switchyard

FROM runtime AS exporter
COPY --from=build-export /opt/venv /opt/venv
CMD ["python", "-m", "examples.export_examples", "--repository", "/models"]

FROM ${LOCUST_IMAGE} AS loadtest
# The gRPC user and the answer checks need tritonclient and numpy; the locustfile itself is mounted (loadtests/).
USER root
RUN pip install --no-cache-dir 'tritonclient[grpc]>=2.51' 'numpy>=1.26,<3'
USER locust

FROM runtime AS serving
EXPOSE 8000 8001
# Readiness, not liveness: ready once every model has settled (README "Serving"); urlopen raises on any non-2xx.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:${SWITCHYARD_PORT}/v2/health/ready', timeout=2)"
CMD ["switchyard", "serve"]

FROM serving AS gateway-gpu
COPY --from=build-gpu /opt/venv /opt/venv
# The CUDA and cuDNN wheels put their libraries under site-packages/nvidia, where the system loader does not look.
ARG NVIDIA_LIBS=/opt/venv/lib/python3.11/site-packages/nvidia
ENV LD_LIBRARY_PATH=${NVIDIA_LIBS}/cuda_runtime/lib:${NVIDIA_LIBS}/cublas/lib:${NVIDIA_LIBS}/cudnn/lib:${NVIDIA_LIBS}/cufft/lib:${NVIDIA_LIBS}/curand/lib:${NVIDIA_LIBS}/cuda_nvrtc/lib

FROM serving AS gateway
COPY --from=build /opt/venv /opt/venv
