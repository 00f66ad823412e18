#pragma once
// AdamW with 8-bit optimizer state, as bitsandbytes' AdamW8bit / PagedAdamW8bit
// (Optimizer2State with optim_bits=8, block_wise=True): per parameter of at least
// min_8bit_size elements, both moments are stored block-wise quantized to 8 bits:
//   - blocks of 2048 consecutive elements of the flattened moment, one fp32 absmax each;
//   - each element is the index of the nearest value of x / absmax in bitsandbytes' dynamic
//     quantization map (create_dynamic_map): the signed map for exp_avg, the unsigned map
//     (values in [0, 1]) for exp_avg_sq.
// A step dequantizes a block, applies exactly AdamW's update (adamw.h: decoupled weight decay,
// lerp first moment, bias corrections, computed in the parameter's dtype), updates the
// parameter from the unquantized new moments, then requantizes the block with its new absmax
// (max |m|, max v over the block). Parameters smaller than min_8bit_size keep fp32 moments
// and follow AdamW exactly, as bitsandbytes does. State bytes per 8-bit parameter element:
// 2 (one code per moment) + 8 per 2048-element block, a quarter of fp32 AdamW's 8.
//
// BF16 parameters (BF16 gradients): computed in fp32 block by block and written back with
// stochastic rounding (stochastic_rounding.h), keyed by options.adamw.seed and the step; their
// small-parameter moments are fp32 (AdamW's). options.adamw.state_dtype must stay F32: the
// moments are 8-bit, so bf16 state would mean nothing (the constructor refuses it, naming
// optimizer.state_dtype, rather than silently ignore it).
//
// Storage: the codes are bytes; the runtime has no byte dtype, so they live in I32 tensors of
// ceil(numel / 4) elements, element i in byte i of the buffer (padding bytes stay 0).
#include <cstdint>
#include <map>
#include <string>

#include "fusetune/optim/adamw.h"
#include "fusetune/optim/optimizer.h"

namespace fusetune {

namespace q8 {

inline constexpr int64_t kBlock = 2048;  // bitsandbytes' block size for 8-bit optimizer state

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): 256 values,
// ascending. Signed: -1 .. 1 (0 at index 127); unsigned: 0 .. 1 (0 at index 0).
const float* dynamic_map(bool is_signed);

// The index of the map value nearest to v (ties: the lower index), v clamped to the map.
int nearest_code(const float* map, float v);

// Block-wise quantization of x[0..n) into codes[0..n) and absmax[0..ceil(n / block)):
// absmax = max |x| over the block, code = nearest_code(map, x / absmax) (0.0's code when the
// block's absmax is 0).
void quantize_blockwise(const float* x, int64_t n, const float* map, int64_t block, uint8_t* codes,
                        float* absmax);
void dequantize_blockwise(const uint8_t* codes, const float* absmax, int64_t n, const float* map,
                          int64_t block, float* out);

}  // namespace q8

struct AdamW8bitOptions {
  AdamWOptions adamw;            // betas, eps, weight_decay (bitsandbytes' defaults = torch's)
  int64_t min_8bit_size = 4096;  // smaller parameters keep fp32 moments
  bool paged = false;            // PagedAdamW8bit: no meaning on a CPU (recorded, not used)
};

class AdamW8bit : public Optimizer {
 public:
  explicit AdamW8bit(AdamW8bitOptions options = {});  // throws on out-of-range values

  const char* name() const override { return "AdamW8bit"; }
  void step(const std::vector<ParamRef>& params, double lr) override;
  // Entries per 8-bit parameter: "<param>.state1" / "<param>.state2" (I32 [ceil(n/4)], the
  // packed codes of exp_avg / exp_avg_sq), "<param>.absmax1" / "<param>.absmax2" (F32
  // [ceil(n/2048)]), "<param>.step". Per smaller parameter: AdamW's "<param>.exp_avg",
  // "<param>.exp_avg_sq", "<param>.step".
  void save_state(NamedTensors& out) const override;
  void load_state(const StateMap& state, const std::vector<ParamRef>& params) override;
  int64_t state_bytes() const override;

  const AdamW8bitOptions& options() const { return options_; }
  int64_t step_count(const std::string& param) const;
  bool is_quantized(int64_t numel) const { return numel >= options_.min_8bit_size; }
  // The state bytes a parameter of `numel` elements of `elem_bytes` each will hold (small
  // ones: two fp32 moments, or F64 for 8-byte elements).
  static int64_t state_bytes_for(int64_t numel, int64_t elem_bytes, int64_t min_8bit_size);

 private:
  struct State {
    Tensor codes1, codes2;    // I32 [ceil(n/4)]: byte codes of exp_avg, exp_avg_sq
    Tensor absmax1, absmax2;  // F32 [blocks]
    int64_t step = 0;
  };
  AdamW8bitOptions options_;
  std::map<std::string, State> state_;  // 8-bit parameters
  AdamW small_;                         // parameters below min_8bit_size: AdamW itself
};

}  // namespace fusetune
