# The ruleloop bot image: the core package only (no torch, no vLLM: the bot talks to engines
# over HTTP). Build: docker build -t ruleloop .   Run: docker run --rm ruleloop canary --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY latency_checker ./latency_checker
RUN pip install . \
 && useradd --system --uid 10001 --home-dir /app ruleloop
COPY adr ./adr
COPY runbooks ./runbooks

USER ruleloop
EXPOSE 3000
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:3000/healthz').status != 200)"
ENTRYPOINT ["ruleloop"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3000"]
