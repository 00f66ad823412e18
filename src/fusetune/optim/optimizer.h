#pragma once
// The optimizer interface recipes program against. The learning rate is passed to every step
// (recipes own the schedule, see lr_schedule.h); everything else is fixed at construction.
// State is keyed by parameter name and allocated lazily on a parameter's first step, with
// Tensor::zeros, so it shows up in memory accounting (core/memory.h).
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/optim/param_ref.h"

namespace fusetune {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// Optimizer state by entry name ("<param>.exp_avg", ...), ordered for reproducible files.
using StateMap = std::map<std::string, Tensor>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;  // "AdamW", "AdamW8bit", "SGD"

  // One update of every parameter that has a gradient (parameters without one are skipped
  // and keep their state untouched, like torch). lr must be finite and >= 0.
  virtual void step(const std::vector<ParamRef>& params, double lr) = 0;

  // Appends the state as named tensors ("<param>.exp_avg", "<param>.step", ...), in name
  // order. The tensors are views of the live buffers, not copies: write them out before the
  // next step.
  virtual void save_state(NamedTensors& out) const = 0;

  // Replaces the state with `state` (the entries save_state produced, without any prefix the
  // recipe added), validated against `params`: every parameter needs its full set of entries
  // with matching shape and dtype, and no entry may be left over. An empty map means "no step
  // taken yet". Throws fusetune::Error naming the entry at fault; on error the current state
  // is unchanged. The tensors are copied (they may be read-only mapped file contents).
  virtual void load_state(const StateMap& state, const std::vector<ParamRef>& params) = 0;

  // Bytes held by the optimizer state (for memory breakdowns).
  virtual int64_t state_bytes() const = 0;
};

// AdamW8bit: bitsandbytes' AdamW8bit and PagedAdamW8bit (adamw8bit.h). AdamW also stands for
// bitsandbytes' 32-bit PagedAdamW (paging has no meaning on a CPU).
enum class OptimizerKind { AdamW, AdamW8bit, SGD };

// Maps a config's optimizer component ("torch.optim.AdamW", "AdamW", "SGD",
// "bitsandbytes.optim.PagedAdamW8bit", ...; case
// insensitive for the short names) to a kind. Unknown names throw with a "did you mean".
OptimizerKind parse_optimizer_kind(const std::string& component);

namespace optim_detail {

// Helpers for load_state implementations: they record which keys were consumed so that
// leftovers can be reported.
class StateReader {
 public:
  StateReader(const StateMap& state, const char* who) : state_(state), who_(who) {}
  // A copy of state[key], which must have the shape of `like` and dtype `dtype`.
  Tensor tensor(const std::string& key, const Shape& like, DType dtype);
  // The step count stored in state[key]: one element, a non-negative integer.
  int64_t step(const std::string& key);
  // Throws when some entry was never read (state from another optimizer, renamed params).
  void expect_all_consumed() const;

 private:
  const Tensor& find(const std::string& key);
  const StateMap& state_;
  const char* who_;
  std::set<std::string> consumed_;
};

// A [1]-shaped I64 tensor holding a step count (what save_state writes for "<param>.step").
Tensor step_tensor(int64_t step);

void check_lr(double lr, const char* who);

}  // namespace optim_detail
}  // namespace fusetune
