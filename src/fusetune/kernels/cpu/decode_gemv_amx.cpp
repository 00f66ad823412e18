// The decode GEMV on AMX tiles (decode_gemv.h): y^T = W x^T, so W [N, K] is the tile product's
// left operand exactly as stored (16 weight rows x 32 bf16 of K per tile load, no packing of
// W), and x^T, the small operand, is put in the pair-interleaved layout the right operand needs
// once per call. Compiled for AMX whatever the build's -march; called only where the CPU has it
// and Linux lets the process use it (amx_tiles_usable()).
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fusetune/core/dtype.h"
#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/decode_gemv.h"
#include "fusetune/kernels/cpu/decode_gemv_rows.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

#define FT_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,sse")))

namespace fusetune::kernels {
namespace {

constexpr int64_t kTileRows = 16;     // weight rows per tile (and K pairs per right operand)
constexpr int64_t kTileK = 32;        // bf16 elements of K per tile load (64 bytes)
constexpr int64_t kTilesPerStep = 4;  // weight tiles per block: 64 rows share each x load

// ldtilecfg's 64-byte operand: palette 1; bytes per row and rows of each tile register.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: the sums of four weight tiles [16, M]; 4-5: weight tiles [16, 32]; 6: x^T [16
// pairs, M]. M columns of 4 bytes (an fp32 sum, or a pair of bf16).
TileConfig tile_config(int64_t M) {
  TileConfig c;
  for (int t = 0; t < 7; ++t) {
    c.rows[t] = uint8_t(kTileRows);
    c.colsb[t] = uint16_t(t == 4 || t == 5 ? kTileK * 2 : M * 4);
  }
  return c;
}

// 64 weight rows (from w, row stride K) against every full piece of K: sums [64, M] into out.
FT_AMX_TARGET void amx_step(const uint16_t* w, int64_t K, const uint32_t* xt, int64_t M,
                            float* out) {
  const long ldw = long(K * 2), ldx = long(M * 4);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k + kTileK <= K; k += kTileK) {
    _tile_loadd(6, xt + (k / 2) * M, ldx);
    _tile_loadd(4, w + k, ldw);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, w + kTileRows * K + k, ldw);
    _tile_dpbf16ps(1, 5, 6);
    _tile_loadd(4, w + 2 * kTileRows * K + k, ldw);
    _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(5, w + 3 * kTileRows * K + k, ldw);
    _tile_dpbf16ps(3, 5, 6);
  }
  _tile_stored(0, out, ldx);
  _tile_stored(1, out + kTileRows * M, ldx);
  _tile_stored(2, out + 2 * kTileRows * M, ldx);
  _tile_stored(3, out + 3 * kTileRows * M, ldx);
}

// 16 weight rows, the same way (the rows past the last 64-row block).
FT_AMX_TARGET void amx_tile(const uint16_t* w, int64_t K, const uint32_t* xt, int64_t M,
                            float* out) {
  const long ldw = long(K * 2), ldx = long(M * 4);
  _tile_zero(0);
  for (int64_t k = 0; k + kTileK <= K; k += kTileK) {
    _tile_loadd(6, xt + (k / 2) * M, ldx);
    _tile_loadd(4, w + k, ldw);
    _tile_dpbf16ps(0, 4, 6);
  }
  _tile_stored(0, out, ldx);
}

FT_AMX_TARGET void amx_begin(const TileConfig& c) { _tile_loadconfig(&c); }
FT_AMX_TARGET void amx_end() { _tile_release(); }

// Adds the products past K's last full piece to sums [rows, M] of weight rows from n0, then
// writes them to y's columns n0.. (one fixed order per output).
void finish_rows(const float* sums, int64_t rows, int64_t n0, int64_t M, int64_t N, int64_t K,
                 const uint16_t* x, const uint16_t* w, void* y, bool y_bf16) {
  const int64_t k_tail = K / kTileK * kTileK;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < rows; ++j) {
      float s = sums[j * M + m];
      for (int64_t k = k_tail; k < K; ++k)
        s = std::fma(gemv_widen(x[m * K + k]), gemv_widen(w[(n0 + j) * K + k]), s);
      if (y_bf16)
        static_cast<uint16_t*>(y)[m * N + n0 + j] = f32_to_bf16(s);
      else
        static_cast<float*>(y)[m * N + n0 + j] = s;
    }
}

}  // namespace

bool amx_tiles_usable() {
  // Linux hands out AMX's 8 KiB of tile state only on request (arch_prctl
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA = 18); a CPU without AMX refuses it.
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;  // CPUID.(7,0):EDX
    return amx_bf16 && amx_tile && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return usable;
}

void decode_gemv_bf16_amx(int64_t M, int64_t N, int64_t K, const uint16_t* x, const uint16_t* w,
                          void* y, bool y_bf16) {
  FT_CHECK(M >= 0 && M <= kDecodeGemvMaxRows, "decode_gemv: M must be <= kDecodeGemvMaxRows");
  FT_CHECK(amx_tiles_usable(), "decode_gemv_bf16_amx: this CPU or kernel gives no AMX tiles");
  if (M == 0 || N == 0) return;
  // x^T as the right operand: row r of piece p holds, for each row m of x, x[m, 32p + 2r] and
  // x[m, 32p + 2r + 1] (one 4-byte pair). A counted scratch tensor of x's own size.
  const int64_t pairs = K / 2;
  Tensor xt_buf = Tensor::empty({std::max<int64_t>(1, pairs * M)}, DType::I32);
  uint32_t* xt = reinterpret_cast<uint32_t*>(xt_buf.data<int32_t>());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < pairs; ++r) std::memcpy(xt + r * M + m, x + m * K + 2 * r, 4);
  const TileConfig config = tile_config(M);
  const int64_t step_rows = kTilesPerStep * kTileRows, steps = (N + step_rows - 1) / step_rows;
#pragma omp parallel if (N * K >= detail::kParallelMin)
  {
    amx_begin(config);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t n0 = s * step_rows, rows = std::min(step_rows, N - n0);
      float sums[kTilesPerStep * kTileRows * kDecodeGemvMaxRows] = {};  // [rows, M]
      if (rows == step_rows) {
        amx_step(w + n0 * K, K, xt, M, sums);
      } else {
        int64_t j = 0;
        for (; j + kTileRows <= rows; j += kTileRows)
          amx_tile(w + (n0 + j) * K, K, xt, M, sums + j * M);
        // The last rows (fewer than a tile): their pieces summed one product at a time.
        for (; j < rows; ++j)
          for (int64_t m = 0; m < M; ++m) {
            float s2 = 0.0f;
            for (int64_t k = 0; k < K / kTileK * kTileK; ++k)
              s2 = std::fma(gemv_widen(x[m * K + k]), gemv_widen(w[(n0 + j) * K + k]), s2);
            sums[j * M + m] = s2;
          }
      }
      finish_rows(sums, rows, n0, M, N, K, x, w, y, y_bf16);
    }
    amx_end();
  }
}

}  // namespace fusetune::kernels
