# Two commands: `make run` trains the default example on 2 local workers; `make test` runs the suite
# (`make test-fast`: the part not marked slow).
# Both create .venv on first use; later calls only reinstall when pyproject.toml or constraints.txt change.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dtpo-installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test test-fast integration lint bench bench-zeus bench-stragglers bench-telemetry bench-agent \
	bench-frameworks gpu-check virtual-gpus clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/dtpo train

test: $(STAMP)
	$(BIN)/python -m pytest -q

# For iterating: the suite less the tests marked slow (they start processes: workers, gloo ranks, Ray; or train long).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# Checks with the real parts: Debian's prometheus scraping a live run, the report in headless Chromium, concurrent
# runs in one store, dtpo launch on unmodified Accelerate / transformers Trainer / Lightning scripts, and the other
# frameworks (Keras on each backend, JAX, TensorFlow: pytest -m framework). Installs the Debian packages (as root, or
# through sudo) and the integration, ecosystems and framework extras where missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
INTEGRATION_STAMP := $(VENV)/.dtpo-integration

$(INTEGRATION_STAMP): $(STAMP)
	$(BIN)/python -c "import playwright, accelerate, transformers, pytorch_lightning, keras, jax, tensorflow" \
		2>/dev/null || $(BIN)/python -m pip install -q -c constraints.txt \
		-e '.[dev,integration,ecosystems,keras,jax,tensorflow-cpu]'
	touch $(INTEGRATION_STAMP)

integration: $(INTEGRATION_STAMP)
	command -v prometheus >/dev/null && command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus chromium; }
	$(BIN)/python -m pytest -q -p no:cacheprovider integration
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "ecosystem or framework" tests

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks integration

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# dtpo's tuner against Zeus's GlobalPowerLimitOptimizer on simulated GPUs; installs zeus (the bench extra) if missing.
bench-zeus: $(STAMP)
	$(BIN)/python -c "import zeus" 2>/dev/null || $(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,bench]'
	@# zeus pulls in amdsmi, which without ROCm's libamd_smi.so breaks `import ray` (KeyError); zeus works without it
	$(BIN)/python -c "import amdsmi" >/dev/null 2>&1 || $(BIN)/python -m pip uninstall -y -q amdsmi 2>/dev/null || true
	$(BIN)/python benchmarks/tuner_vs_zeus.py

# Per-rank DVFS for stragglers on simulated jobs (8, 16, 64 GPUs): bloat recovered and slowdown; exit 1 on a missed goal.
bench-stragglers: $(STAMP)
	$(BIN)/python benchmarks/straggler_dvfs.py

# Uneven per-rank batches for stragglers on simulated jobs (8, 16, 64 GPUs): throughput against the ideal (the sum of
# the ranks' speeds), against per-rank DVFS and with both; energy per sample; then real 2-rank gloo runs with one
# virtual GPU slowed (--real-rounds 0 skips them); exit 1 on a missed goal.
.PHONY: bench-rebalance
bench-rebalance: $(STAMP)
	$(BIN)/python benchmarks/rebalance.py

# Carbon-aware scheduling on simulated GPUs: signal-blind, throttle, pause and the oracle on the shipped UK carbon-intensity
# trace and a synthetic one, jobs of 1-48 h, slack 0-100 %; exit 1 on a missed goal.
.PHONY: bench-grid
bench-grid: $(STAMP)
	$(BIN)/python benchmarks/grid_aware.py

# The power-swing report against the truth of simulated jobs with step phases (8 to 4,096 GPUs), and the what-if
# table; exit 1 when a figure is off by more than 5 %.
.PHONY: bench-power-swing
bench-power-swing: $(STAMP)
	$(BIN)/python benchmarks/power_swing.py

# Step time with the Prometheus exporter, run store and traces on against off (paired, A/A control); exit 1 above 1.01.
bench-telemetry: $(STAMP)
	$(BIN)/python benchmarks/telemetry_overhead.py

# An unmodified DDP script under plain torchrun against `dtpo launch` with the agent (paired launches, A/A control):
# exit 1 above a step-time ratio of 1.01, when the agent's step and sample counts differ from the script's, or
# when the A/A control itself is outside +-1 % (too noisy for a verdict).
bench-agent: $(STAMP)
	$(BIN)/python benchmarks/agent_overhead.py

# JAX, TensorFlow and Keras loops with and without dtpo's step reporting (paired, A/A control); counts must match;
# exit 1 above a step-time ratio of 1.02. Installs the framework extras if missing.
bench-frameworks: $(STAMP)
	$(BIN)/python -c "import keras, jax, tensorflow" 2>/dev/null || \
		$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,keras,jax,tensorflow-cpu]'
	$(BIN)/python benchmarks/frameworks.py

# dtpo on a real NVIDIA GPU in about 8 minutes, no GPU setting changed (benchmarks/gpu_check.py; GPU_CHECK_FLAGS='--out
# note.md'): no pip, the python3 or .venv that has CUDA (.venv first), with PYTHONPATH=src; exit 1 on a failed check.
# Without a GPU it says why and exits 0.
gpu-check:
	@py=$(PYTHON); cuda='import sys, torch; sys.exit(not torch.cuda.is_available())'; \
	if [ -x $(BIN)/python ] && { $(BIN)/python -c "$$cuda" 2>/dev/null || ! $(PYTHON) -c "$$cuda" 2>/dev/null; }; \
	then py=$(BIN)/python; fi; echo "gpu-check: $$py benchmarks/gpu_check.py $(GPU_CHECK_FLAGS)"; \
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $$py benchmarks/gpu_check.py $(GPU_CHECK_FLAGS)

# Two virtual A40s in build/virtual-gpus: dtpo's NVML stand-in built from source with the system's cc, for running
# dtpo's real NVML paths without a GPU (`export DTPO_VIRTUAL_GPUS=build/virtual-gpus`; every figure is simulated).
virtual-gpus: $(STAMP)
	$(BIN)/dtpo virtual-gpus create build/virtual-gpus --gpu A40 --count 2 --root

clean:
	rm -rf $(VENV) runs build/virtual-gpus
