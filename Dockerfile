# The ruleloop bot image: the core package only. No torch, no vLLM: the bot talks to engines
# over HTTP, so the `engine` extra is never installed here.
#   docker build -t ruleloop .
#   docker run --rm -p 3000:3000 -e RULELOOP_ALERTMANAGER_TOKEN=... ruleloop
#   docker run --rm ruleloop canary --help
# tests/test_deploy_packaging.py checks this file (stages, user, healthcheck, COPY sources).

# --- build: a wheel of the package, installed with its core dependencies into a venv ---
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY latency_checker ./latency_checker
RUN python -m venv /opt/ruleloop \
 && /opt/ruleloop/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/ruleloop/bin/pip install /wheels/ruleloop-*.whl \
 && /opt/ruleloop/bin/ruleloop --version

# --- final: the venv, the files the bot reads, a non-root user ---
FROM python:3.11-slim

ENV PATH=/opt/ruleloop/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib \
    MPLCONFIGDIR=/tmp/matplotlib

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
