# syntax=docker/dockerfile:1
# Controller and agent image without torch. Build from the repository root:
#   docker build -f deploy/images/controller.Dockerfile -t registry.example.com/fthsdp/controller:0.1.0 .
# (controller.Dockerfile.dockerignore next to this file trims the context; BuildKit reads it.)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
# Generate the gRPC modules from the .proto (same command as `make protos`), then build a wheel.
RUN pip install grpcio-tools==1.85.1 \
 && python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/controller.proto \
 && pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
 && groupadd --gid 10001 fthsdp && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin fthsdp
COPY --chmod=0755 deploy/images/grpc_health_probe.py /usr/local/bin/fthsdp-grpc-health
USER 10001:10001
EXPOSE 50051 50052 8080
ENTRYPOINT ["fthsdp"]
CMD ["--help"]
