#include "fusetune/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

LRSchedule::LRSchedule(LRScheduleKind kind, double base_lr, int64_t warmup, int64_t training,
                       double num_cycles)
    : kind_(kind),
      base_lr_(base_lr),
      warmup_(warmup),
      training_(training),
      num_cycles_(num_cycles) {
  FT_CHECK(std::isfinite(base_lr) && base_lr >= 0,
           "lr schedule: base lr must be finite and >= 0, got " + std::to_string(base_lr));
  FT_CHECK(warmup >= 0,
           "lr schedule: num_warmup_steps must be >= 0, got " + std::to_string(warmup));
  FT_CHECK(training >= 0,
           "lr schedule: num_training_steps must be >= 0, got " + std::to_string(training));
  FT_CHECK(std::isfinite(num_cycles), "lr schedule: num_cycles must be finite");
}

LRSchedule LRSchedule::constant(double base_lr) {
  return LRSchedule(LRScheduleKind::Constant, base_lr, 0, 0, 0.5);
}
LRSchedule LRSchedule::constant_with_warmup(double base_lr, int64_t num_warmup_steps) {
  return LRSchedule(LRScheduleKind::ConstantWithWarmup, base_lr, num_warmup_steps, 0, 0.5);
}
LRSchedule LRSchedule::cosine_with_warmup(double base_lr, int64_t num_warmup_steps,
                                          int64_t num_training_steps, double num_cycles) {
  return LRSchedule(LRScheduleKind::CosineWithWarmup, base_lr, num_warmup_steps, num_training_steps,
                    num_cycles);
}
LRSchedule LRSchedule::linear_with_warmup(double base_lr, int64_t num_warmup_steps,
                                          int64_t num_training_steps) {
  return LRSchedule(LRScheduleKind::LinearWithWarmup, base_lr, num_warmup_steps, num_training_steps,
                    0.5);
}

double LRSchedule::multiplier(int64_t step) const {
  FT_CHECK(step >= 0, "lr schedule: step must be >= 0, got " + std::to_string(step));
  // Python's int / int is a true division of the (exactly representable) doubles.
  const auto warmup_lambda = [&] { return double(step) / double(std::max<int64_t>(1, warmup_)); };
  switch (kind_) {
    case LRScheduleKind::Constant:
      return 1.0;
    case LRScheduleKind::ConstantWithWarmup:
      return step < warmup_ ? warmup_lambda() : 1.0;
    case LRScheduleKind::CosineWithWarmup: {
      if (step < warmup_) return warmup_lambda();
      const double progress =
          double(step - warmup_) / double(std::max<int64_t>(1, training_ - warmup_));
      // Same association as torchtune: math.pi * num_cycles * 2.0 * progress.
      const double multiple =
          0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles_ * 2.0 * progress));
      return std::max(0.0, multiple);
    }
    case LRScheduleKind::LinearWithWarmup:
      if (step < warmup_) return warmup_lambda();
      return std::max(0.0,
                      double(training_ - step) / double(std::max<int64_t>(1, training_ - warmup_)));
  }
  return 1.0;
}

double LRSchedule::lr_at(int64_t step) const { return base_lr_ * multiplier(step); }

LRScheduleKind parse_lr_schedule_kind(const std::string& component) {
  // The last dotted segment names the function; the module path varies across torchtune
  // versions (torchtune.modules, torchtune.training.lr_schedulers) and transformers.
  const std::string fn = component.substr(component.rfind('.') + 1);
  if (fn == "constant" || fn == "get_constant_schedule") return LRScheduleKind::Constant;
  if (fn == "get_constant_schedule_with_warmup") return LRScheduleKind::ConstantWithWarmup;
  if (fn == "get_cosine_schedule_with_warmup") return LRScheduleKind::CosineWithWarmup;
  if (fn == "get_linear_schedule_with_warmup") return LRScheduleKind::LinearWithWarmup;
  const std::vector<std::string> known = {
      "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
      "get_cosine_schedule_with_warmup", "get_linear_schedule_with_warmup",
      "get_constant_schedule_with_warmup", "constant"};
  std::string hint = closest_match(component, known);
  if (hint.empty()) hint = closest_match(fn, known);
  throw Error("unknown lr_scheduler '" + component + "'" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; supported: get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup, "
              "get_constant_schedule_with_warmup, constant");
}

}  // namespace fusetune
