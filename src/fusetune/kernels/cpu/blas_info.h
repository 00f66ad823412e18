#pragma once
// Which BLAS and which of its kernels run, for log headers and benchmark tables.
#include <string>

namespace fusetune::kernels {

// One line, e.g. "OpenBLAS 0.3.21 ... USE_OPENMP Cooperlake MAX_THREADS=64 core=Cooperlake",
// plus " (OPENBLAS_CORETYPE=X)" when that environment variable forces the kernel choice.
// OpenBLAS built with DYNAMIC_ARCH picks kernels from the CPU at load time; on this AVX-512
// machine a forced "Haswell" (AVX2) core runs sgemm at about half the speed (bench/gemm).
std::string blas_description();

}  // namespace fusetune::kernels
