#!/usr/bin/env bash
# Installs a local CPU Triton Inference Server (2.51, python backend only) from the nvidia-pytriton wheel,
# plus the python-backend stub environment, under .triton/ (see ../../README.md and TRITON_CPU notes).
#
#   deploy/triton/install.sh [TARGET_DIR]      # default: <repo>/.triton
#
# Idempotent: each step leaves a marker holding what it installed and is skipped when the marker matches.
# Environment: PYTHON (an interpreter whose base prefix is a CPython 3.11 built with --enable-shared;
# default python3), TORCH_SPEC (default torch==2.13.0+cpu, found on local disk through PIP_FIND_LINKS), UV (a uv
# binary that installs the stub env's packages in pip's place, much faster; `make install` passes its own).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET="${1:-$ROOT/.triton}"
PYTRITON_VERSION="0.7.0"
WHEEL="nvidia_pytriton-${PYTRITON_VERSION}-py3-none-manylinux_2_35_x86_64.whl"
WHEEL_SHA256="21f063ff93bb426d0c06b7a55e7eb9efcfe62c0dddd9a908e9877e18710128df"
# The stub is built with pybind11 2.10: under numpy 2 every output tensor comes back mis-sized.
NUMPY_SPEC="numpy==1.26.4"
ONNXRUNTIME_SPEC="${ONNXRUNTIME_SPEC:-onnxruntime}"
# The +cpu local label matches only the CPU wheel, so pip can never pull a CUDA build from PyPI.
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}"

DIST="$TARGET/dist"
SERVER="$TARGET/server"
STUBENV="$TARGET/stubenv"
S="$SERVER/pytriton/tritonserver"

say() { printf '[triton-install +%ss] %s\n' "$((SECONDS - started))" "$*"; }
die() { printf '[triton-install] error: %s\n' "$*" >&2; exit 1; }
started=$SECONDS

# The stub embeds the interpreter it finds as python3 on PATH and links libpython3.11.so dynamically,
# so the stub env must come from a CPython 3.11 with a shared libpython (the machine's base install).
PREFIX="$("${PYTHON:-python3}" -c 'import sys; print(sys.base_prefix)')" || die "no python3 on PATH (set PYTHON)"
PY="$PREFIX/bin/python3.11"
[ -x "$PY" ] || die "$PY not found: the python backend stub needs CPython 3.11 (set PYTHON to one)"
[ "$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED"))')" = "1" ] \
  || die "$PY is not built with a shared libpython (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)"
[ -e "$PREFIX/lib/libpython3.11.so.1.0" ] || die "$PREFIX/lib/libpython3.11.so.1.0 missing"
say "base interpreter: $PY"
mkdir -p "$TARGET" "$DIST"

# 1. The wheel, checked against the known digest.
if [ -f "$DIST/$WHEEL" ] && echo "$WHEEL_SHA256  $DIST/$WHEEL" | sha256sum --check --status; then
  say "wheel present: $DIST/$WHEEL"
else
  say "downloading nvidia-pytriton==$PYTRITON_VERSION (~55 MB)"
  rm -f "$DIST/$WHEEL"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$DIST" "nvidia-pytriton==$PYTRITON_VERSION"
  echo "$WHEEL_SHA256  $DIST/$WHEEL" | sha256sum --check --status \
    || die "sha256 of $DIST/$WHEEL is not $WHEEL_SHA256; refusing to use it"
  say "sha256 ok"
fi

# 2. The server: the wheel extracted as is (binaries find their libraries through relative RPATHs).
if [ "$(cat "$SERVER/.installed" 2>/dev/null || true)" = "$WHEEL_SHA256" ]; then
  say "server present: $S/bin/tritonserver"
else
  say "extracting tritonserver into $SERVER"
  rm -rf "$SERVER" "$SERVER.partial"
  "$PY" -m zipfile -e "$DIST/$WHEEL" "$SERVER.partial"
  P="$SERVER.partial/pytriton/tritonserver"
  chmod 755 "$P/bin/tritonserver" "$P"/python_backend_stubs/*/triton_python_backend_stub  # zip drops exec bits
  cp "$P/python_backend_stubs/3.11/triton_python_backend_stub" "$P/backends/python/"
  echo "$WHEEL_SHA256" > "$SERVER.partial/.installed"
  mv "$SERVER.partial" "$SERVER"
fi

# 3. The stub env: what model.py imports must live here, not in the project's env.
STUB_SPECS="$NUMPY_SPEC $ONNXRUNTIME_SPEC $TORCH_SPEC"
STUB_MARK="$PY $STUB_SPECS"
if [ "$(cat "$STUBENV/.installed" 2>/dev/null || true)" = "$STUB_MARK" ]; then
  say "stub env present: $STUBENV"
else
  say "creating stub env $STUBENV ($STUB_SPECS)"
  rm -rf "$STUBENV"
  "$PY" -m venv "$STUBENV"
  if [ -n "${UV:-}" ] && [ -x "$UV" ]; then
    install=("$UV" pip install --quiet --compile-bytecode --python "$STUBENV/bin/python" ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"})
  else
    install=("$STUBENV/bin/python" -m pip install --quiet)
  fi
  # shellcheck disable=SC2086  # the specs are meant to split
  if ! "${install[@]}" $STUB_SPECS; then
    die "${install[0]} could not install $STUB_SPECS; the CPU torch wheel comes from PIP_FIND_LINKS (now: ${PIP_FIND_LINKS:-unset})"
  fi
  "$STUBENV/bin/python" - <<'EOF' || die "stub env check failed"
import numpy, onnxruntime, torch
assert numpy.__version__.startswith("1."), numpy.__version__
assert not torch.version.cuda, f"CUDA torch {torch.__version__} in the stub env"
print(f"[triton-install] stub env: numpy {numpy.__version__}, onnxruntime {onnxruntime.__version__}, torch {torch.__version__}")
EOF
  echo "$STUB_MARK" > "$STUBENV/.installed"
fi

say "ready: $S/bin/tritonserver, stub env $STUBENV"
