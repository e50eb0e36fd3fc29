# One image for every Prism process: the pipeline worker (`prism run`), the schema registry
# (`prism schema serve`) and the CLI. The lake job's Java runtime lives in the `lake` target so
# the worker image stays small.
#
#   make image                                   # base image + worker image + lake image (scripts/build-image.sh)
#   podman build -t localhost/prism:latest .     # worker/registry image (the default target)
#   podman build --target lake -t localhost/prism-lake:latest .
#
# BASE_IMAGE needs python3 >= 3.11 with the venv module and a Debian userland (apt-get, useradd).
# Without a registry, scripts/build-base-image.sh debootstraps one (localhost/prism-base:bookworm);
# with a registry, --build-arg BASE_IMAGE=docker.io/library/python:3.11-slim works as well.
ARG BASE_IMAGE=localhost/prism-base:bookworm

# ---- builder: compilers and headers, only for wheels that must be built from source ------------
FROM ${BASE_IMAGE} AS builder
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    pkgs="gcc libc6-dev"; \
    python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
        || pkgs="$pkgs python3-dev"; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends $pkgs >/dev/null; \
    rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/prism/venv PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Behind a TLS-inspecting proxy, pass the CA bundle pip must trust as a build secret (never a layer):
#   podman build --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt ...   (build-image.sh does)
ENV PIP_CA_SECRET=/run/secrets/ca-bundle
RUN --mount=type=secret,id=ca-bundle \
    if [ -s "$PIP_CA_SECRET" ]; then export PIP_CERT="$PIP_CA_SECRET"; fi; \
    python3 -m venv "$VIRTUAL_ENV" && "$VIRTUAL_ENV/bin/pip" install -q --upgrade pip setuptools wheel
WORKDIR /src
# Dependencies first, from pyproject.toml alone: editing app/ re-runs only the last, seconds-long layer.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca-bundle \
    if [ -s "$PIP_CA_SECRET" ]; then export PIP_CERT="$PIP_CA_SECRET"; fi; \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && "$VIRTUAL_ENV/bin/pip" install -q -r /tmp/requirements.txt
# The project itself goes to its own prefix, /opt/prism/app, which this .pth puts on the venv's
# path: the runtime stage copies the big dependency venv and the small app as separate layers,
# so a code change neither re-copies nor stores another 1.4 GB venv layer.
RUN "$VIRTUAL_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths(vars={"base": "/opt/prism/app", "platbase": "/opt/prism/app"})["purelib"])' \
        > "$("$VIRTUAL_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/prism-app.pth"

# ---- app: the project on top of the dependencies (seconds) -----------------------------------------
FROM builder AS app
COPY README.md ./
COPY app ./app
# --no-build-isolation: setuptools and wheel are in the venv already, so this layer needs no network.
RUN "$VIRTUAL_ENV/bin/pip" install -q --no-deps --no-build-isolation --no-warn-script-location --prefix /opt/prism/app . \
    && /opt/prism/app/bin/prism --help >/dev/null

# ---- runtime: the venv and nothing to compile with -----------------------------------------------
FROM ${BASE_IMAGE} AS runtime
# PRISM_WEB_BIND: in a container the management port must listen on every interface, or a
# published port (`podman run -p 6066:6066`) reaches nothing; pause/resume/restart still need an
# admin user, and outside a container the default stays 127.0.0.1.
ENV VIRTUAL_ENV=/opt/prism/venv \
    PATH=/opt/prism/app/bin:/opt/prism/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    PRISM_WEB_BIND=0.0.0.0
# A fixed uid so volumes and Kubernetes securityContext (runAsUser: 10001) can rely on it.
RUN groupadd --gid 10001 prism \
    && useradd --uid 10001 --gid 10001 --no-log-init --home-dir /srv/prism --create-home --shell /usr/sbin/nologin prism \
    && install -d -o 10001 -g 10001 /srv/prism/var
COPY --from=builder /opt/prism/venv /opt/prism/venv
COPY --from=app /opt/prism/app /opt/prism/app
# Working directory: the relative defaults (topologies/..., var/data, var/dev-keys, the
# registry's sqlite file) resolve here. The topologies are root-owned (read-only for prism);
# /srv/prism/var is the one place to mount a volume for state (RocksDB tables, the keys).
# The worker makes no keys: `prism keys init` (once, into that volume) or a mounted Secret.
WORKDIR /srv/prism
COPY topologies ./topologies
USER 10001:10001
# Worker web port (--web-port) and the registry's default port.
EXPOSE 6066 8081
ENTRYPOINT ["prism"]
CMD ["run", "--topology", "topologies/orders-created.yaml", "--web-port", "6066"]

# ---- lake: the runtime plus a Java runtime for Spark (`prism lake compact|optimize|vacuum|stats`) -----
FROM runtime AS lake
USER root
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
USER 10001:10001
CMD ["lake", "--help"]

# ---- default target: the worker / registry image ----------------------------------------------------
FROM runtime AS worker
