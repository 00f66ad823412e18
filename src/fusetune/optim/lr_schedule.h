#pragma once
// Learning-rate schedules as multipliers of a base lr, with PyTorch's LambdaLR indexing: the
// lr used for optimizer step k (0-based) is base_lr * lambda(k), because torch recipes call
// scheduler.step() after optimizer.step(). So with warmup the very first step runs at lr 0.
// The lambdas are transcribed from torchtune / Hugging Face transformers, operation for
// operation, so the values match theirs bit for bit.
#include <cstdint>
#include <string>

namespace fusetune {

enum class LRScheduleKind {
  Constant,            // lambda = 1
  ConstantWithWarmup,  // transformers.get_constant_schedule_with_warmup
  CosineWithWarmup,    // torchtune get_cosine_schedule_with_warmup
  LinearWithWarmup,    // transformers.get_linear_schedule_with_warmup
};

class LRSchedule {
 public:
  static LRSchedule constant(double base_lr);
  static LRSchedule constant_with_warmup(double base_lr, int64_t num_warmup_steps);
  // lambda(k) = k / max(1, W) for k < W, else max(0, 0.5 * (1 + cos(pi * num_cycles * 2 *
  // progress))), progress = (k - W) / max(1, N - W).
  static LRSchedule cosine_with_warmup(double base_lr, int64_t num_warmup_steps,
                                       int64_t num_training_steps, double num_cycles = 0.5);
  // lambda(k) = k / max(1, W) for k < W, else max(0, (N - k) / max(1, N - W)).
  static LRSchedule linear_with_warmup(double base_lr, int64_t num_warmup_steps,
                                       int64_t num_training_steps);

  double lr_at(int64_t step) const;       // base_lr * multiplier(step); step >= 0
  double multiplier(int64_t step) const;  // lambda(step)

  LRScheduleKind kind() const { return kind_; }
  double base_lr() const { return base_lr_; }
  int64_t num_warmup_steps() const { return warmup_; }
  int64_t num_training_steps() const { return training_; }
  double num_cycles() const { return num_cycles_; }

 private:
  LRSchedule(LRScheduleKind kind, double base_lr, int64_t warmup, int64_t training,
             double num_cycles);
  LRScheduleKind kind_;
  double base_lr_;
  int64_t warmup_;
  int64_t training_;
  double num_cycles_;
};

// Maps a config's lr_scheduler component (torchtune's full dotted path, the bare function
// name, or "constant") to a kind. Unknown names throw with a "did you mean".
LRScheduleKind parse_lr_schedule_kind(const std::string& component);

}  // namespace fusetune
