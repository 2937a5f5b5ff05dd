# syntax=docker/dockerfile:1
# One image for both processes: `agenttx serve` (the gRPC service) and `agenttx operator`
# (the AgentTxPolicy operator); the Helm chart picks one with the container args.
#
#   docker build -t agenttx:dev .                 # runtime image (the default target)
#   docker build --target dev -t agenttx:dev .    # + writable package dirs for Tilt syncs
#
# The builder stage has the compilers and build tools; the final stages get only the
# virtualenv it produced, run as uid 10001, and have no compiler.
ARG PYTHON_VERSION=3.11

# ---- builder: resolve and install everything into /opt/agenttx ----------------------
FROM python:${PYTHON_VERSION}-slim AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/agenttx \
 && /opt/agenttx/bin/pip install --upgrade pip setuptools wheel
WORKDIR /src
# Dependencies first (a layer that survives source edits): read them from both
# pyprojects (the service's own pin on agenttx-client is satisfied from client/ below),
# plus the client's [console] extra: the chart runs `agenttx console` from this image.
COPY pyproject.toml README.md ./
COPY client/pyproject.toml client/README.md ./client/
RUN python -c "import tomllib; docs = [tomllib.load(open(f, 'rb'))['project'] for f in ('pyproject.toml', 'client/pyproject.toml')]; deps = [d for p in docs for d in p['dependencies'] if not d.startswith('agenttx')] + docs[1]['optional-dependencies']['console']; print('\n'.join(deps))" > /tmp/requirements.txt \
 && /opt/agenttx/bin/pip install -r /tmp/requirements.txt
COPY client ./client
COPY service ./service
COPY operator ./operator
COPY bench ./bench
RUN /opt/agenttx/bin/pip install --no-deps ./client . \
 && /opt/agenttx/bin/agenttx serve --help > /dev/null \
 && /opt/agenttx/bin/python -c "import jinja2, starlette, uvicorn"

# ---- runtime base: slim Python, the venv, an unprivileged user ----------------------
FROM python:${PYTHON_VERSION}-slim AS runtime-base
ENV PATH=/opt/agenttx/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 agenttx \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/agenttx \
      --no-create-home --shell /usr/sbin/nologin agenttx \
 && mkdir -p /var/lib/agenttx /sandboxes \
 && chown 10001:10001 /var/lib/agenttx /sandboxes
COPY --from=builder /opt/agenttx /opt/agenttx
WORKDIR /var/lib/agenttx
USER 10001:10001
# 50051: gRPC (serve); 8080: liveness (operator).
EXPOSE 50051 8080
ENTRYPOINT ["agenttx"]
CMD ["serve", "--listen", "0.0.0.0:50051"]

# ---- dev: what Tilt's live_update syncs into must be writable by uid 10001 ------------
FROM runtime-base AS dev
USER root
RUN chown -R 10001:10001 /opt/agenttx/lib/python*/site-packages/agenttx \
                         /opt/agenttx/lib/python*/site-packages/agenttx_operator
USER 10001:10001

# ---- runtime (default target) ---------------------------------------------------------
FROM runtime-base AS runtime
