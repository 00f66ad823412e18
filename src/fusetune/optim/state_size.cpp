#include "fusetune/optim/state_size.h"

#include "fusetune/optim/adamw8bit.h"

namespace fusetune {

int64_t OptimizerStateSize::bytes(int64_t numel, int64_t nbytes) const {
  if (min_8bit_numel > 0 && numel >= min_8bit_numel)
    return AdamW8bit::state_bytes_for(numel, numel > 0 ? nbytes / numel : 0, min_8bit_numel);
  return int64_t(double(nbytes) * per_param_byte);
}

}  // namespace fusetune
