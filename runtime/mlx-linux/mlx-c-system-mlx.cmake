# CMake toolchain file that the `cmake` crate passes to mlx-sys's build of mlx-c
# on Linux (via CMAKE_TOOLCHAIN_FILE_<target> in .cargo/config.toml). It makes
# mlx-c use the prebuilt libmlx of the pinned Python wheel instead of fetching
# and building MLX, so Rust and the Python oracle run the very same library.
set(MLX_C_USE_SYSTEM_MLX ON CACHE BOOL "use the wheel's prebuilt MLX" FORCE)
set(MLX_C_BUILD_EXAMPLES OFF CACHE BOOL "no mlx-c examples" FORCE)
get_filename_component(_archgen_mlx "$ENV{MLX_PREFIX}" REALPATH)
if(NOT EXISTS "${_archgen_mlx}/share/cmake/MLX/MLXConfig.cmake")
  message(FATAL_ERROR
    "\narchgen: no MLX found at MLX_PREFIX='$ENV{MLX_PREFIX}'.\n"
    "Run the setup step once:   cargo xtask setup\n"
    "(it installs cmake/libclang/g++ and the pinned mlx[cpu]==0.32.2 wheel into .venv),\n"
    "then `cargo clean -p mlx-sys` and build again.\n")
endif()
set(MLX_DIR "${_archgen_mlx}/share/cmake/MLX" CACHE PATH "MLXConfig.cmake directory" FORCE)
# The prelude must reach mlx-c's C++ only; see project-include.cmake.
set(CMAKE_PROJECT_INCLUDE "${CMAKE_CURRENT_LIST_DIR}/project-include.cmake")
