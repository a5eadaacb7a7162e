#!/usr/bin/env bash
# cargo's rustc wrapper (see .cargo/config.toml): `rustc-wrapper.sh RUSTC ARGS...`.
# Off Linux, or with no MLX_PREFIX, it runs rustc unchanged (macOS keeps
# mlx-sys's own static/Metal build). On Linux it fixes the link lines that
# mlx-sys's build script writes for macOS, for the mlx_sys crate only:
#   static=mlx -> dylib=mlx (the wheel ships libmlx.so), c++ -> stdc++ (the wheel
#   and g++ use libstdc++), and drops static=gguflib (inside libmlx.so), objc and
#   framework=* (rustc rejects frameworks off Apple).
# Every crate also gets -L and an rpath to the wheel's lib dir, by its real path:
# libmlx.so finds its BLAS through $ORIGIN/../../mlx_cpu.libs.
# A wrapper set in the environment (RUSTC_WRAPPER, e.g. sccache) would replace
# this one; chain it through ARCHGEN_INNER_WRAPPER instead.
set -euo pipefail
rustc="$1"
shift
inner=()
[[ -n "${ARCHGEN_INNER_WRAPPER:-}" ]] && inner=("$ARCHGEN_INNER_WRAPPER")
if [[ "$(uname -s)" != Linux || -z "${MLX_PREFIX:-}" ]]; then
  exec "${inner[@]}" "$rustc" "$@"
fi
libdir="$(realpath -m "$MLX_PREFIX/lib")"

crate="" prev=""
for a in "$@"; do
  [[ "$prev" == --crate-name ]] && crate="$a"
  prev="$a"
done

fix_lib() {
  case "$1" in
    static=mlx) echo "dylib=mlx" ;;
    c++ | dylib=c++) echo "stdc++" ;;
    static=gguflib | objc | dylib=objc | framework=*) echo "" ;;
    *) echo "$1" ;;
  esac
}

args=()
while (($#)); do
  a="$1"
  shift
  if [[ "$crate" == mlx_sys && "$a" == -l ]]; then
    v="$(fix_lib "$1")"
    shift
    [[ -n "$v" ]] && args+=(-l "$v")
    continue
  elif [[ "$crate" == mlx_sys && "$a" == -l?* ]]; then
    v="$(fix_lib "${a#-l}")"
    [[ -n "$v" ]] && args+=("-l$v")
    continue
  fi
  args+=("$a")
done
# `rustc -vV` and other probes carry no --crate-name: leave them alone.
# Before setup the directory does not exist yet; crates that do not link MLX
# (xtask, the spec crate) must still build then.
if [[ -n "$crate" && -d "$libdir" ]]; then
  args+=(-L "native=$libdir" -C "link-arg=-Wl,-rpath,$libdir")
fi
exec "${inner[@]}" "$rustc" "${args[@]}"
