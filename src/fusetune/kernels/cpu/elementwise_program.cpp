#include "fusetune/kernels/cpu/elementwise_program.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/kernels/cpu/vexp.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

void validate(const std::vector<EwInstr>& code, size_t ninputs,
              const std::vector<int64_t>& input_numel, int64_t n) {
  FT_CHECK(!code.empty(), "elementwise_program: empty program");
  FT_CHECK(input_numel.size() == ninputs, "elementwise_program: input sizes do not match inputs");
  for (size_t i = 0; i < ninputs; ++i)
    FT_CHECK(input_numel[i] >= 1 && n % input_numel[i] == 0,
             "elementwise_program: input " + std::to_string(i) + " has " +
                 std::to_string(input_numel[i]) + " elements, which does not divide " +
                 std::to_string(n));
  bool written[kEwMaxRegs] = {};
  for (size_t pc = 0; pc < code.size(); ++pc) {
    const EwInstr& I = code[pc];
    const std::string at = "elementwise_program: instruction " + std::to_string(pc);
    auto reg = [&](int32_t r) {
      FT_CHECK(r >= 0 && r < kEwMaxRegs && written[r], at + " reads an unset register");
    };
    switch (I.op) {
      case EwOp::Load:
        FT_CHECK(I.a >= 0 && size_t(I.a) < ninputs, at + " loads a missing input");
        break;
      case EwOp::Const:
        break;
      case EwOp::Add:
      case EwOp::Mul:
      case EwOp::SiluBackward:
        reg(I.a);
        reg(I.b);
        break;
      case EwOp::Scale:
      case EwOp::Silu:
        reg(I.a);
        FT_CHECK(I.b >= 0 && I.b < kEwMaxRegs, at + " has an operand out of range");
        break;
      default:
        throw Error(at + " has an unknown opcode");
    }
    FT_CHECK(I.dst >= 0 && I.dst < kEwMaxRegs, at + " writes a register out of range");
    written[I.dst] = true;
  }
}

// Elements [s, s + len) of an input repeating every nb elements, into d.
template <class T>
void load_repeating(const T* x, int64_t nb, int64_t s, int64_t len, T* d) {
  if (nb == 1) {
    std::fill(d, d + len, x[0]);
    return;
  }
  int64_t o = s % nb;
  for (int64_t j = 0; j < len;) {
    const int64_t m = std::min(len - j, nb - o);
    std::memcpy(d + j, x + o, size_t(m) * sizeof(T));
    j += m;
    o = 0;
  }
}

}  // namespace

template <class T>
void elementwise_program(const std::vector<EwInstr>& code, const std::vector<const T*>& inputs,
                         const std::vector<int64_t>& input_numel, T* out, int64_t n) {
  validate(code, inputs.size(), input_numel, n);
  if (n == 0) return;
  const int64_t nblocks = (n + kEwBlock - 1) / kEwBlock;
  const size_t last = code.size() - 1;
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMin)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    alignas(64) T buf[kEwMaxRegs][kEwBlock];
    const T* reg[kEwMaxRegs] = {};
    const int64_t s = blk * kEwBlock;
    const int64_t len = std::min(kEwBlock, n - s);
    for (size_t pc = 0; pc < code.size(); ++pc) {
      const EwInstr& I = code[pc];
      // Only the last instruction writes the output, after every read of this block.
      T* d = pc == last ? out + s : buf[I.dst];
      // Register operands (validated above); Load's and Const's a/b are not registers.
      const bool regs = I.op != EwOp::Load && I.op != EwOp::Const;
      const T* x = regs ? reg[I.a] : nullptr;
      const T* y = regs ? reg[I.b] : nullptr;
      switch (I.op) {
        case EwOp::Load: {
          const int64_t nb = input_numel[size_t(I.a)];
          const T* src = inputs[size_t(I.a)];
          if (nb == n && pc != last) {
            d = const_cast<T*>(src + s);  // read in place, never written through
          } else if (nb == n) {
            if (d != src + s) std::memmove(d, src + s, size_t(len) * sizeof(T));
          } else {
            load_repeating(src, nb, s, len, d);
          }
          break;
        }
        case EwOp::Const: {
          const T c = T(I.c);
          std::fill(d, d + len, c);
          break;
        }
        case EwOp::Add:
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) d[j] = x[j] + y[j];
          break;
        case EwOp::Mul:
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) d[j] = x[j] * y[j];
          break;
        case EwOp::Scale: {
          const T c = T(I.c);
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) d[j] = x[j] * c;
          break;
        }
        case EwOp::Silu:
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) d[j] = x[j] / (T(1) + detail::vexp(-x[j]));
          break;
        case EwOp::SiluBackward:
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) {
            const T sg = T(1) / (T(1) + detail::vexp(-x[j]));
            d[j] = y[j] * (sg * (T(1) + x[j] * (T(1) - sg)));
          }
          break;
      }
      reg[I.dst] = d;
    }
  }
}

std::vector<double> encode_program(const std::vector<EwInstr>& code) {
  std::vector<double> w;
  w.reserve(code.size() * 5);
  for (const EwInstr& I : code) {
    w.push_back(double(int32_t(I.op)));
    w.push_back(double(I.dst));
    w.push_back(double(I.a));
    w.push_back(double(I.b));
    w.push_back(I.c);
  }
  return w;
}

std::vector<EwInstr> decode_program(const std::vector<double>& w) {
  FT_CHECK(!w.empty() && w.size() % 5 == 0, "elementwise program: " + std::to_string(w.size()) +
                                                " words, expected 5 per instruction");
  std::vector<EwInstr> code(w.size() / 5);
  for (size_t i = 0; i < code.size(); ++i) {
    const double* p = w.data() + 5 * i;
    FT_CHECK(p[0] >= 0 && p[0] <= double(int32_t(EwOp::SiluBackward)),
             "elementwise program: unknown opcode at instruction " + std::to_string(i));
    for (int k = 1; k < 4; ++k)
      FT_CHECK(p[k] >= 0 && p[k] < 1e6,
               "elementwise program: bad operand at instruction " + std::to_string(i));
    code[i] = {EwOp(int32_t(p[0])), int32_t(p[1]), int32_t(p[2]), int32_t(p[3]), p[4]};
  }
  return code;
}

#define FT_INSTANTIATE(T)                                                                         \
  template void elementwise_program<T>(const std::vector<EwInstr>&, const std::vector<const T*>&, \
                                       const std::vector<int64_t>&, T*, int64_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace fusetune::kernels
