# The ruleloop bot image: the core package only. No torch, no vLLM: the bot talks to engines
# over HTTP, so the `engine` extra is never installed here.
#   docker build -t ruleloop .
#   docker run --rm -p 3000:3000 -e RULELOOP_ALERTMANAGER_TOKEN=... ruleloop
#   docker run --rm ruleloop canary --help
# Reproducible: the base image is pinned by digest and every dependency comes from
# requirements.lock, exact versions with their sha256 hashes (pip --require-hashes), so the same
# commit builds the same image. docs/deploy.md says how to refresh both.
# tests/test_deploy_packaging.py checks this file (stages, user, healthcheck, COPY sources, the
# digest, the lock) and tests/test_deploy_lock.py the lock against pyproject.toml.

# python:3.11-slim-bookworm (Python 3.11.16), the multi-platform index digest Docker Hub
# published for the tag in September 2026. Refresh it deliberately, with the digest from
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# or build against another base with --build-arg PYTHON_IMAGE=...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

# --- build: the locked dependencies, then a wheel of the package, into a venv ---
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The lock first: this layer is rebuilt only when the dependencies change.
COPY requirements.lock ./
RUN python -m venv /opt/ruleloop \
 && /opt/ruleloop/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md LICENSE ./
COPY bot ./bot
COPY latency_checker ./latency_checker
# The wheel is built with the locked setuptools (no build isolation: nothing unpinned is
# fetched) and installed without dependencies; pip check fails the build if the lock misses one.
RUN /opt/ruleloop/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/ruleloop/bin/pip install --no-deps /wheels/ruleloop-*.whl \
 && /opt/ruleloop/bin/pip check \
 && /opt/ruleloop/bin/ruleloop --version

# --- final: the venv, the files the bot reads, a non-root user ---
FROM ${PYTHON_IMAGE}

ENV PATH=/opt/ruleloop/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib \
    MPLCONFIGDIR=/tmp/matplotlib

# git for the GitOps actuator (bot/change/gitops/git.py runs the `git` CLI) and ssh for its deploy key
# (GIT_SSH_COMMAND); recommends left out, apt lists removed. tests/test_deploy_image_binaries.py
# checks that every program the bot runs is installed here.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client \
 && rm -rf /var/lib/apt/lists/*

# uid 10001: outside the range of host users, as Kubernetes' runAsNonRoot wants a numeric uid.
RUN groupadd --system --gid 10001 ruleloop \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home ruleloop \
 && mkdir -p /var/lib/ruleloop \
 && chown 10001:10001 /var/lib/ruleloop

COPY --from=build /opt/ruleloop /opt/ruleloop
WORKDIR /app
# What `ruleloop serve` reads at startup ([paths] adr and runbooks are relative to /app), and
# the deploy files operators copy from the image (rules, Alertmanager route, Slack manifest).
COPY adr ./adr
COPY runbooks ./runbooks
COPY deploy ./deploy

USER 10001:10001
EXPOSE 3000
# State (the SQLite store when no RULELOOP_DATABASE_URL, console charts) goes to /var/lib/ruleloop.
VOLUME ["/var/lib/ruleloop"]
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:3000/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["ruleloop"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3000"]
