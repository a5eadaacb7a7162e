#!/usr/bin/env bash
# Brings a fresh machine to the state the build and the tests need. Safe to run
# again: every step checks before it acts.
#   Linux (Debian/Ubuntu): apt packages for mlx-sys's build (cmake, libclang for
#     bindgen, g++ which MLX's CPU `compile` also calls at run time), then a venv
#     with the pinned MLX wheel whose libmlx.so the Rust build links.
#   macOS: mlx-rs builds MLX itself (Metal); only the Python oracle venv is made.
# The venv (.venv at the repository root) also holds the Python oracle, mlx-lm.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Pins move together: mlx-rs =0.33.0 -> mlx-sys 0.7.0 -> mlx-c pins MLX v0.32.2.
MLX_VERSION=0.32.2
MLX_LM_VERSION=0.32.2
NUMPY_SPEC="numpy>=1.26,<3"
# The chat tests' references: transformers renders chat templates (no torch
# needed), tokenizers builds the test tokenizer, openai is the client that
# `archgen serve` is tested with.
TRANSFORMERS_VERSION=5.24.0
OPENAI_VERSION=3.57.0
# The L2 oracle (tests/python/optiq_oracle.py): mlx-optiq's per-layer mixed KV.
# Installed without its dependencies: its KV path (optiq.serve.install_mixed_kv)
# imports only mlx, mlx-lm (with mlx_lm.server) and the standard library, while
# its full list (flask, textual, pygame, ...) serves its own CLI and UI.
OPTIQ_VERSION=0.7.7

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

os="$(uname -s)"
if [[ "$os" == Linux ]]; then
  # curl: the `archgen serve` test's raw-HTTP client.
  APT_PKGS="cmake libclang1-14 libclang-common-14-dev g++ make python3-venv curl"
  missing=""
  for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [[ -n "$missing" ]]; then
    command -v apt-get >/dev/null || die "missing packages:$missing, and no apt-get here. Install them with your package manager, then rerun."
    [[ "$(id -u)" == 0 ]] && sudo="" || sudo="sudo"
    say "installing apt packages:$missing"
    $sudo apt-get update -qq || die "apt-get update failed (network or permissions); cannot install:$missing"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null \
      || die "apt-get install failed for:$missing"
  fi
  MLX_PIP="mlx[cpu]==${MLX_VERSION}"
elif [[ "$os" == Darwin ]]; then
  command -v cmake >/dev/null || die "cmake not found: install it (e.g. 'brew install cmake'); mlx-sys needs it to build MLX"
  MLX_PIP="mlx==${MLX_VERSION}"
else
  die "unsupported OS '$os': archgen builds on Linux (CPU) and macOS (Metal)"
fi

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || die "python3 not found; install Python 3.10 or newer"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "$("$PY" --version 2>&1) is too old; mlx-lm needs Python 3.10 or newer"
if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv"
  "$PY" -m venv .venv || die "'$PY -m venv' failed; on Debian install python3-venv"
fi

want="mlx==${MLX_VERSION} mlx-lm==${MLX_LM_VERSION}"
have_all=1
for w in $want; do
  name="${w%%==*}"; ver="${w##*==}"
  got="$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n "s/^Version: //p" || true)"
  [[ "$got" == "$ver" ]] || have_all=0
done
if [[ "$os" == Linux ]]; then
  .venv/bin/python -m pip show mlx-cpu >/dev/null 2>&1 || have_all=0
fi
if ((have_all == 0)); then
  say "installing $MLX_PIP, mlx-lm==${MLX_LM_VERSION} and numpy into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check \
    "$MLX_PIP" "mlx-lm==${MLX_LM_VERSION}" "$NUMPY_SPEC" \
    || die "pip could not install $MLX_PIP / mlx-lm==${MLX_LM_VERSION} (is PyPI reachable?)"
fi

chat_want="transformers==${TRANSFORMERS_VERSION} openai==${OPENAI_VERSION}"
chat_ok=1
for w in $chat_want; do
  name="${w%%==*}"; ver="${w##*==}"
  got="$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n "s/^Version: //p" || true)"
  [[ "$got" == "$ver" ]] || chat_ok=0
done
if ((chat_ok == 0)); then
  say "installing $chat_want (chat template and server tests) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check $chat_want \
    || die "pip could not install $chat_want (is PyPI reachable?)"
fi

got="$(.venv/bin/python -m pip show mlx-optiq 2>/dev/null | sed -n "s/^Version: //p" || true)"
if [[ "$got" != "$OPTIQ_VERSION" ]]; then
  say "installing mlx-optiq==${OPTIQ_VERSION} (L2 oracle, --no-deps) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "mlx-optiq==${OPTIQ_VERSION}" \
    || die "pip could not install mlx-optiq==${OPTIQ_VERSION} (is PyPI reachable?)"
fi

if [[ "$os" == Linux ]]; then
  prefix="$(.venv/bin/python -c 'import mlx, os; print(os.path.realpath(mlx.__path__[0]))')"
  [[ -f "$prefix/share/cmake/MLX/MLXConfig.cmake" && -f "$prefix/lib/libmlx.so" ]] \
    || die "the mlx wheel at $prefix has no libmlx.so/MLXConfig.cmake; reinstall with: .venv/bin/pip install --force-reinstall '$MLX_PIP'"
  ln -sfn "$prefix" .venv/mlx-prefix
  say "MLX_PREFIX -> $prefix"
fi
say "ok"
