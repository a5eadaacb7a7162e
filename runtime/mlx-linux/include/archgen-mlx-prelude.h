/* Force-included into mlx-c's C++ (via project-include.cmake) and into
 * bindgen's parse (via BINDGEN_EXTRA_CLANG_ARGS) on Linux only. */
#ifndef ARCHGEN_MLX_PRELUDE_H
#define ARCHGEN_MLX_PRELUDE_H

/* mlx-c's half.h declares float16_t / bfloat16_t and the *_float16 / *_bfloat16
 * accessors (which mlx-rs always calls) only on ARM. Pre-empt it on x86-64. */
#if !defined(__aarch64__) && !defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC)
#define MLX_HALF_H
#define HAS_FLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
#include <mlx/types/half_types.h>
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
/* For bindgen: these give exactly the Rust types mlx-rs expects, as on macOS
 * (__BindgenFloat16(u16) and u16). Only pointers cross the ABI. */
typedef __fp16 float16_t;
typedef unsigned short bfloat16_t;
#endif
#endif

/* GCC 12's libstdc++ lacks std::format, which mlx-c uses for a few error
 * strings ("{}" placeholders only). A minimal stand-in. */
#ifdef __cplusplus
#include <version>
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>
namespace std {
inline void archgen_format_rest(ostringstream& out, string_view fmt) { out << fmt; }
template <class T, class... Rest>
void archgen_format_rest(ostringstream& out, string_view fmt, const T& value, const Rest&... rest) {
  const auto at = fmt.find("{}");
  if (at == string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, at) << value;
  archgen_format_rest(out, fmt.substr(at + 2), rest...);
}
template <class... Args>
string format(string_view fmt, const Args&... args) {
  ostringstream out;
  archgen_format_rest(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif
#endif

#endif
