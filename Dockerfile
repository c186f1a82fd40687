# syntax=docker/dockerfile:1
# The endpoint picker image: python -m extproc (serve | mock-worker | envoy-config | demo).
#
#   docker build -t extproc:0.1.0 .
#   docker run --rm -p 9002:9002 -p 9003:9003 -v $PWD/picker.yaml:/etc/extproc/config/picker.yaml \
#     extproc:0.1.0 serve --config /etc/extproc/config/picker.yaml --host 0.0.0.0
#
# Reproducible: the runtime dependencies are installed from requirements.lock, every version pinned
# and every file checked against its sha256 (--require-hashes), wheels only (no compiler, no sdist
# builds). The package itself is copied, not built, so no unpinned build backend runs either.
# Regenerate the lock after changing dependencies in pyproject.toml (Python 3.11, pip-tools):
#   pip-compile --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
#     --no-emit-find-links --output-file=requirements.lock pyproject.toml
# For fully pinned builds, pin the base image by digest too: PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/extproc
COPY requirements.lock /tmp/requirements.lock
RUN /opt/extproc/bin/pip install --no-deps --require-hashes --only-binary=:all: -r /tmp/requirements.lock \
    && /opt/extproc/bin/pip check
WORKDIR /app
COPY extproc ./extproc
# Bytecode compiled now: the root filesystem is read-only in the pod (gateway/base/deployment.yaml).
RUN /opt/extproc/bin/python -m compileall -q /app/extproc

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="extproc" \
      org.opencontainers.image.description="KV-cache-aware endpoint picker for LLM serving behind Envoy (ext_proc)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 extproc \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin extproc
COPY --from=build /opt/extproc /opt/extproc
COPY --from=build /app /app
ENV PATH=/opt/extproc/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /app
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# ext_proc gRPC, gRPC health, admin HTTP (/metrics); the router-group API uses 9100 when enabled.
EXPOSE 9002 9003 9090
ENTRYPOINT ["python", "-m", "extproc"]
CMD ["--help"]
