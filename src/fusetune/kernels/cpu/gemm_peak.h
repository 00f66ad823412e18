#pragma once
// Peak GEMM throughput of this machine, the denominator of model FLOP utilization.
#include <cstdint>

namespace fusetune::kernels {

// Times float32 [n,n]x[n,n] GEMMs through kernels::gemm for about 0.2 s with the current
// OpenMP thread count and returns the best GFLOP/s of a single call (2 n^3 flops). n >= 1.
double measure_peak_gemm_gflops(int64_t n = 1024);

}  // namespace fusetune::kernels
