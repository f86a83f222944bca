# syntax=docker/dockerfile:1
# Example trainer image: torch (CPU or CUDA wheels), the fthsdp library and a training script.
# The agent DaemonSet runs this image too (`fthsdp agent` starts trainers on its host).
#   CPU:  docker build -f deploy/images/trainer.Dockerfile -t registry.example.com/fthsdp/trainer:0.1.0 .
#   CUDA: docker build -f deploy/images/trainer.Dockerfile --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#           -t registry.example.com/fthsdp/trainer:0.1.0 .
# CUDA wheels carry their CUDA runtime; the node needs the NVIDIA driver and container toolkit.
# The `cuda` extra (CuPy) is what FTAR imports to reduce CUDA tensors; a CPU-only image may leave
# it out (--build-arg EXTRAS=train). HOME is /home/fthsdp: the manifests mount a writable
# emptyDir there (kernel, Triton and compiler caches) since the root filesystem is read-only.
# Replace deploy/examples/train.py with your own script (TRAIN_SCRIPT build argument).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip install grpcio-tools==1.85.1 \
 && python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/controller.proto \
 && pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TRAIN_SCRIPT=deploy/examples/train.py
ARG EXTRAS=train,cuda
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/home/fthsdp
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY --from=build /wheels /wheels
RUN WHEEL="$(ls /wheels/*.whl)" && pip install "${WHEEL}[${EXTRAS}]" && rm -rf /wheels \
 && groupadd --gid 10001 fthsdp \
 && useradd --uid 10001 --gid 10001 --home-dir /home/fthsdp --create-home --shell /usr/sbin/nologin fthsdp
COPY --chmod=0644 ${TRAIN_SCRIPT} /opt/fthsdp/train.py
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT []
CMD ["python", "/opt/fthsdp/train.py", "--help"]
