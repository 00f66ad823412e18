// Kernel selection for DYNAMIC_ARCH OpenBLAS (see blas_setup.h).
#include "fusetune/kernels/cpu/blas_setup.h"

#include <cblas.h>

#include <cstdlib>

// Exported by DYNAMIC_ARCH builds only; weak so that other OpenBLAS builds still link (the
// addresses are then null and configure_blas() leaves the library alone).
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace fusetune::kernels {

std::string blas_description() {
  return std::string(openblas_get_config()) + " core=" + openblas_get_corename();
}

std::string configure_blas() {
  const std::string before = openblas_get_corename();
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    return "OpenBLAS core " + before + " (OPENBLAS_CORETYPE set by the user)";
  }
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2_fallback = before == "Haswell" || before == "Zen";
  if (avx512 && avx2_fallback && gotoblas_dynamic_init != nullptr &&
      gotoblas_dynamic_quit != nullptr) {
    gotoblas_dynamic_quit();
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);  // read by gotoblas_dynamic_init
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    return "OpenBLAS core " + before + " -> " + openblas_get_corename() +
           " (AVX-512 CPU not recognized by this OpenBLAS)";
  }
#endif
  return "OpenBLAS core " + before;
}

}  // namespace fusetune::kernels
