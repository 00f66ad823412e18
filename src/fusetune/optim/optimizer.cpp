#include "fusetune/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

OptimizerKind parse_optimizer_kind(const std::string& component) {
  std::string lower = component;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (lower == "torch.optim.adamw" || lower == "adamw") return OptimizerKind::AdamW;
  // bitsandbytes' 32-bit PagedAdamW: AdamW (paging has no meaning on a CPU).
  if (lower == "bitsandbytes.optim.pagedadamw" || lower == "pagedadamw" ||
      lower == "bitsandbytes.optim.pagedadamw32bit" || lower == "pagedadamw32bit")
    return OptimizerKind::AdamW;
  if (lower == "torch.optim.sgd" || lower == "sgd") return OptimizerKind::SGD;
  if (lower == "bitsandbytes.optim.adamw8bit" || lower == "adamw8bit" ||
      lower == "bitsandbytes.optim.pagedadamw8bit" || lower == "pagedadamw8bit")
    return OptimizerKind::AdamW8bit;
  const std::vector<std::string> known = {"torch.optim.AdamW",
                                          "torch.optim.SGD",
                                          "bitsandbytes.optim.AdamW8bit",
                                          "bitsandbytes.optim.PagedAdamW8bit",
                                          "bitsandbytes.optim.PagedAdamW",
                                          "AdamW",
                                          "AdamW8bit",
                                          "PagedAdamW8bit",
                                          "PagedAdamW",
                                          "SGD"};
  std::string hint = closest_match(component, known);
  throw Error("unknown optimizer '" + component + "'" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; supported: " + join(known, ", "));
}

namespace optim_detail {

const Tensor& StateReader::find(const std::string& key) {
  auto it = state_.find(key);
  if (it == state_.end()) {
    std::vector<std::string> names;
    for (const auto& kv : state_) names.push_back(kv.first);
    std::string hint = closest_match(key, names);
    throw Error(std::string(who_) + " state: missing entry '" + key + "'" +
                (hint.empty() ? "" : " (found '" + hint + "')") +
                "; was this state saved by another optimizer or for other parameters?");
  }
  consumed_.insert(key);
  return it->second;
}

Tensor StateReader::tensor(const std::string& key, const Shape& like, DType dtype) {
  const Tensor& t = find(key);
  FT_CHECK(t.defined(), std::string(who_) + " state: entry '" + key + "' is empty");
  FT_CHECK(t.dtype() == dtype, std::string(who_) + " state: entry '" + key + "' is " +
                                   dtype_name(t.dtype()) + ", expected " + dtype_name(dtype));
  FT_CHECK(t.shape() == like, std::string(who_) + " state: entry '" + key + "' has shape " +
                                  shape_str(t.shape()) + ", expected " + shape_str(like) +
                                  " (the parameter's shape)");
  return t.clone();
}

int64_t StateReader::step(const std::string& key) {
  const Tensor& t = find(key);
  FT_CHECK(t.defined() && t.numel() == 1, std::string(who_) + " state: entry '" + key +
                                              "' must hold one step count, has shape " +
                                              shape_str(t.shape()));
  // Accept integer and float encodings (torch stores steps as float32 tensors).
  const double v = element_as_double(t, 0);
  FT_CHECK(std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9.0e15,
           std::string(who_) + " state: entry '" + key + "' is not a step count (" +
               std::to_string(v) + ")");
  return int64_t(v);
}

void StateReader::expect_all_consumed() const {
  for (const auto& kv : state_) {
    if (consumed_.count(kv.first)) continue;
    throw Error(std::string(who_) + " state: unexpected entry '" + kv.first +
                "' (no trainable parameter of that name, or state from another optimizer)");
  }
}

Tensor step_tensor(int64_t step) {
  Tensor t = Tensor::empty({1}, DType::I64);
  t.data<int64_t>()[0] = step;
  return t;
}

void check_lr(double lr, const char* who) {
  FT_CHECK(std::isfinite(lr) && lr >= 0,
           std::string(who) + ": learning rate must be finite and >= 0, got " + std::to_string(lr));
}

}  // namespace optim_detail
}  // namespace fusetune
