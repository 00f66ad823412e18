#pragma once
// Which OpenBLAS kernels run, and picking better ones where OpenBLAS guesses wrong.
#include <string>

namespace fusetune::kernels {

// One line for logs: "OpenBLAS 0.3.21 ... core=SkylakeX".
std::string blas_description();

// OpenBLAS built with DYNAMIC_ARCH picks its kernels from the CPU model at load time. Versions
// older than the CPU (0.3.21 on AMD Zen 5) fall back to the AVX2 "Haswell" kernels although
// the CPU has AVX-512; the "SkylakeX" kernels then run sgemm about 1.9x faster (bench/gemm).
// This re-selects SkylakeX in that case: only when the user has not set OPENBLAS_CORETYPE
// (setting it, e.g. to Haswell, opts out), the CPU reports AVX-512 F/BW/DQ/VL, and the library
// exports its dynamic-arch entry points. Call once at startup, before any BLAS call runs on
// another thread. Returns what it did, as one line.
std::string configure_blas();

}  // namespace fusetune::kernels
