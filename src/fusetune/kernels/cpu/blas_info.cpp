#include "fusetune/kernels/cpu/blas_info.h"

#include <cblas.h>

#include <cstdlib>

namespace fusetune::kernels {

std::string blas_description() {
  std::string s = std::string(openblas_get_config()) + " core=" + openblas_get_corename();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) {
    s += std::string(" (OPENBLAS_CORETYPE=") + forced + ")";
  }
  return s;
}

}  // namespace fusetune::kernels
