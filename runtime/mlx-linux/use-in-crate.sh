#!/usr/bin/env bash
# The one setup step for a crate outside this repository that depends on
# archgen-runtime (and archgen-macros, archgen-monolith):
#
#   /path/to/archgen/runtime/mlx-linux/use-in-crate.sh /path/to/your-crate
#
# Linux: makes sure this checkout's .venv holds the pinned MLX wheel (it runs
# setup.sh when it does not), then writes YOUR-CRATE/.cargo/config.toml. That
# file points cargo at this checkout's build glue and at the wheel's libmlx,
# with absolute paths, so mlx-rs/mlx-sys (unmodified, from crates.io) build
# against the same libmlx.so as this repository and the Python oracle. Cargo
# reads it whenever it runs inside YOUR-CRATE, whatever the target directory.
# Moved this checkout? Run the script again.
# macOS: nothing to write; mlx-rs keeps its defaults and builds MLX with Metal.
#
# Why a config file and not something a dependency carries: docs/decisions.md D9.
set -euo pipefail

say() { printf 'use-in-crate: %s\n' "$*" >&2; }
die() { printf 'use-in-crate: error: %s\n' "$*" >&2; exit 1; }

[[ $# == 1 ]] || die "usage: $0 CRATE_DIR   (the directory of your crate's Cargo.toml, or of its workspace root)"
crate_arg="$1"
[[ -f "$crate_arg/Cargo.toml" ]] || die "$crate_arg: no Cargo.toml there; pass your crate's (or workspace's) root directory"
crate="$(cd "$crate_arg" && pwd -P)"
archgen="$(cd "$(dirname "$0")/../.." && pwd -P)"
glue="$archgen/runtime/mlx-linux"

case "$(uname -s)" in
  Darwin)
    say "macOS: nothing to write. mlx-rs keeps its default features and builds MLX with Metal"
    say "(needs the Xcode command line tools and cmake); plain 'cargo build' in $crate works."
    exit 0
    ;;
  Linux) ;;
  *) die "unsupported OS '$(uname -s)': archgen builds on Linux (CPU) and macOS (Metal)" ;;
esac

# The values go into TOML literal strings and a shell-split bindgen argument.
for p in "$crate" "$archgen"; do
  [[ "$p" != *[\'\"\\]* && "$p" != *$'\n'* ]] \
    || die "$p: the path holds a quote, backslash or newline, which the config cannot carry; move it"
done

prefix="$archgen/.venv/mlx-prefix"
if [[ -f "$prefix/lib/libmlx.so" && -f "$prefix/share/cmake/MLX/MLXConfig.cmake" ]]; then
  say "MLX wheel found: $(readlink -f "$prefix")"
else
  say "no MLX wheel in $archgen/.venv yet: running setup.sh (apt packages, .venv with mlx[cpu]==0.32.2)"
  bash "$glue/setup.sh" || die "setup.sh failed (see above); fix that, then run this script again"
  [[ -f "$prefix/lib/libmlx.so" ]] || die "setup.sh ran but $prefix/lib/libmlx.so is missing"
fi

# Comments say why, for whoever opens the file later.
settings="$(cat <<EOF
[build]
# Rewrites mlx-sys's macOS link lines (static MLX, frameworks) for the wheel's
# libmlx.so and gives every binary an rpath to it. To chain another wrapper
# (sccache), set ARCHGEN_INNER_WRAPPER instead of RUSTC_WRAPPER.
rustc-wrapper = '$glue/rustc-wrapper.sh'

[env]
MLX_PREFIX = '$prefix'
# Makes mlx-c use the wheel's MLX instead of fetching and building it.
CMAKE_TOOLCHAIN_FILE_x86_64_unknown_linux_gnu = '$glue/mlx-c-system-mlx.cmake'
CMAKE_TOOLCHAIN_FILE_aarch64_unknown_linux_gnu = '$glue/mlx-c-system-mlx.cmake'
# x86-64 half types for bindgen (mlx-c declares them on ARM only).
BINDGEN_EXTRA_CLANG_ARGS_x86_64_unknown_linux_gnu = '-include "$glue/include/archgen-mlx-prelude.h"'
BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu = '-include "$glue/include/archgen-mlx-prelude.h"'
EOF
)"

config="$crate/.cargo/config.toml"
marker="# Written by archgen's runtime/mlx-linux/use-in-crate.sh."
if [[ -e "$config" ]] && ! head -n 1 "$config" | grep -qxF "$marker"; then
  die "$config exists and was not written by this script, so it is left alone.
Add these settings to it (merge [build] and [env] with tables it already has):

$settings"
fi

mkdir -p "$crate/.cargo"
tmp="$(mktemp "$crate/.cargo/.config.toml.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
cat >"$tmp" <<EOF
$marker
# Linux: mlx-rs / mlx-sys (unmodified, from crates.io) build against the libmlx of
# the pinned wheel mlx[cpu]==0.32.2 in archgen's .venv, through archgen's glue:
#   $archgen
# The paths are this machine's: do not commit this file. Run the script again
# after moving that checkout, then 'cargo clean -p mlx-sys' (its build does not
# notice a changed toolchain file). docs/adding-a-model.md, "Using a spec from
# your own crate", says more.
$settings
EOF
mv -f "$tmp" "$config"
trap - EXIT
say "wrote $config"
say "now: cd $crate && cargo build"
