#pragma once
// A small elementwise program run over blocks of elements: what fuse_elementwise turns a tree
// of Add/Mul/Scale/Silu/SiluBackward nodes into, so each input byte is read once and only the
// result is written. Registers hold one block (kEwBlock elements) each; an instruction runs a
// vectorizable loop over the block. Inputs repeat every numel_i elements (numel_i == n: same
// size; 1: a scalar; otherwise a suffix broadcast row), so element e reads x_i[e % numel_i].
// The arithmetic per element is the unfused kernels' (elementwise.cpp), so results match them.
#include <cstdint>
#include <vector>

namespace fusetune::kernels {

enum class EwOp : int32_t {
  Load,          // dst = input a
  Const,         // dst = c
  Add,           // dst = a + b
  Mul,           // dst = a * b
  Scale,         // dst = a * c
  Silu,          // dst = silu(a)
  SiluBackward,  // dst = b * silu'(a)   (a = x, b = dy)
};

struct EwInstr {
  EwOp op = EwOp::Const;
  int32_t dst = 0, a = 0, b = 0;
  double c = 0.0;
};

inline constexpr int kEwMaxRegs = 16;
inline constexpr int64_t kEwBlock = 256;

// The result is the last instruction's. Throws fusetune::Error on a malformed program (a
// register out of range or read before it is written, an input out of range, an input size
// that does not divide n). out may be the same buffer as a same-size input (each block's
// result is written after the block's inputs are read).
template <class T>
void elementwise_program(const std::vector<EwInstr>& code, const std::vector<const T*>& inputs,
                         const std::vector<int64_t>& input_numel, T* out, int64_t n);

// Graph attributes store the program as doubles, 5 per instruction.
std::vector<double> encode_program(const std::vector<EwInstr>& code);
std::vector<EwInstr> decode_program(const std::vector<double>& words);

}  // namespace fusetune::kernels
