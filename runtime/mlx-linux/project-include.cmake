# Runs after every project() call. Only mlx-c's project ("mlx.data") and only its
# C++ sources get the prelude: CMake's own compiler checks (try_compile) also run
# project includes, and a C compile with a C++ header would break them.
if(PROJECT_NAME STREQUAL "mlx.data")
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include ${CMAKE_CURRENT_LIST_DIR}/include/archgen-mlx-prelude.h>")
endif()
