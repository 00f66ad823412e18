// The machine's measured memory bandwidth (read and copy), the yardstick of the decode
// benchmark: batch-1 decode reads every weight once per token.
#include <cstdio>

#include "bench_args.h"
#include "memory_bandwidth.h"

int main(int argc, char** argv) try {
  fusetune::bench::BenchArgs args(argc, argv, {{"repeats", "5"}});
  const auto b = fusetune::bench::measure_bandwidth(int(args.i64("repeats")));
  std::printf("threads %d: read %.2f GB/s, copy %.2f GB/s (read + write bytes; best of %lld)\n",
              omp_get_max_threads(), b.read_gbs, b.copy_gbs, (long long)args.i64("repeats"));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_memory_bandwidth: %s\n", e.what());
  return 1;
}
