#include "fusetune/optim/adamw.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "fusetune/optim/adamw_math.h"
#include "fusetune/optim/parallel_min.h"
#include "fusetune/optim/stochastic_rounding.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Below this many elements a parallel region costs more than it saves.

// The rows (dim 0) of a parameter: the unit of AdamW's lazy rows. A vector is cut into rows of
// 4096 elements (the last one shorter), so that its update still spreads over the threads.
struct RowShape {
  int64_t rows, cols, n;
  int64_t end(int64_t row) const { return std::min(n, (row + 1) * cols); }
};
RowShape row_shape(const Tensor& value) {
  const int64_t n = value.numel();
  if (n == 0) return {0, 1, 0};
  if (value.shape().size() >= 2) return {value.shape()[0], n / value.shape()[0], n};
  constexpr int64_t kVectorRow = 4096;
  return {(n + kVectorRow - 1) / kVectorRow, kVectorRow, n};
}

// True when every element is +0 or -0: an OR of the bits without the sign, which vectorizes
// (no early exit: a row is at most a few KiB).
template <class P>
bool all_zero(const P* g, int64_t n) {
  using Bits = std::conditional_t<sizeof(P) == 2, uint16_t,
                                  std::conditional_t<sizeof(P) == 4, uint32_t, uint64_t>>;
  constexpr Bits magnitude = Bits(~Bits(0)) >> 1;
  Bits any = 0;
  for (int64_t i = 0; i < n; ++i) any |= std::bit_cast<Bits>(g[i]) & magnitude;
  return any == 0;
}

// T: the compute type (float, or double for F64 parameters); P, M: how the parameter (and its
// gradient) and the moments are stored (T itself, or uint16_t for bf16). With P = M = T this
// is exactly the element update of fp32 / fp64 AdamW.
//
// Lazy rows, bitwise the dense update: a row whose gradient is all zero and whose moments are
// all zero (`active` clear: never touched, or decayed to zero) would, updated densely, keep zero
// moments and move only by the weight decay. So only its parameter is read and written, through
// the same update with g = m = v = 0 (nothing at all when that leaves p as it is: no decay and
// eps > 0). An embedding table's step then costs its touched rows plus one pass over p instead
// of four reads and three writes of every element. A row the update leaves with any non-zero
// moment stays active; its moments decay on every step as the dense update's do.
//
// A gradient with a row set (core/tensor.h: an embedding's) says which rows may be non-zero, so
// the others are known zero without reading them (`touched`, one flag per row; null: test).
template <class T, class P, class M>
void adamw_update(P* p, const P* g, M* m, M* v, RowShape shape, uint8_t* active,
                  const uint8_t* touched, const adamw_math::Coefficients& c,
                  const bf16::Stream& r) {
  const adamw_math::Update<T> update(c);
  const bool idle_rows_stay = update.decay == T(1) && update.eps > T(0);
  const int64_t cols = shape.cols;
#pragma omp parallel for schedule(static) if (shape.n >= kOptimizerParallelMin)
  for (int64_t row = 0; row < shape.rows; ++row) {
    const int64_t begin = row * cols, end = shape.end(row);
    if (!active[row] && (touched ? !touched[row] : all_zero(g + begin, end - begin))) {
      if (idle_rows_stay) continue;
      for (int64_t i = begin; i < end; ++i) {
        T pi = bf16::load(p[i]), mi = 0, vi = 0;
        update(pi, T(0), mi, vi);
        bf16::store(p[i], pi, r, bf16::Buffer::Value, i);
      }
      continue;
    }
    for (int64_t i = begin; i < end; ++i) {
      T pi = bf16::load(p[i]), mi = bf16::load(m[i]), vi = bf16::load(v[i]);
      update(pi, bf16::load(g[i]), mi, vi);
      bf16::store(m[i], mi, r, bf16::Buffer::ExpAvg, i);
      bf16::store(v[i], vi, r, bf16::Buffer::ExpAvgSq, i);
      bf16::store(p[i], pi, r, bf16::Buffer::Value, i);
    }
    // A separate pass over the row just written (in cache), so the loop above vectorizes.
    active[row] = !all_zero(m + begin, end - begin) || !all_zero(v + begin, end - begin);
  }
}

// One flag per row of `shape` for the rows `grad`'s row set names; empty when it has none (or
// its rows are not these rows).
std::vector<uint8_t> touched_rows(const Tensor& grad, RowShape shape) {
  const RowSet* set = grad.nonzero_rows().get();
  if (!set || set->row_bytes != shape.cols * int64_t(dtype_size(grad.dtype()))) return {};
  std::vector<uint8_t> touched(size_t(shape.rows), 0);
  for (int32_t row : set->rows) touched[size_t(row)] = 1;
  return touched;
}

template <class T, class P, class M>
void update_tensors(const Tensor& value, const Tensor& grad, Tensor& m, Tensor& v, uint8_t* active,
                    const adamw_math::Coefficients& c, const bf16::Stream& r) {
  const RowShape shape = row_shape(value);
  const std::vector<uint8_t> touched = touched_rows(grad, shape);
  adamw_update<T>(value.data<P>(), grad.data<P>(), m.data<M>(), v.data<M>(), shape, active,
                  touched.empty() ? nullptr : touched.data(), c, r);
}

// Which rows have a non-zero moment (a state loaded from a checkpoint).
template <class M>
std::vector<uint8_t> rows_with_moments(const Tensor& m, const Tensor& v, RowShape shape) {
  std::vector<uint8_t> active(size_t(shape.rows), 0);
  for (int64_t row = 0; row < shape.rows; ++row) {
    const int64_t begin = row * shape.cols, len = shape.end(row) - begin;
    active[size_t(row)] =
        !all_zero(m.data<M>() + begin, len) || !all_zero(v.data<M>() + begin, len);
  }
  return active;
}

std::vector<uint8_t> active_rows(const Tensor& m, const Tensor& v, RowShape shape) {
  switch (m.dtype()) {
    case DType::F64:
      return rows_with_moments<double>(m, v, shape);
    case DType::BF16:
      return rows_with_moments<uint16_t>(m, v, shape);
    default:
      return rows_with_moments<float>(m, v, shape);
  }
}

}  // namespace

AdamW::AdamW(AdamWOptions options) : options_(options) {
  const auto& o = options_;
  FT_CHECK(o.beta1 >= 0 && o.beta1 < 1,
           "AdamW: beta1 must be in [0, 1), got " + std::to_string(o.beta1));
  FT_CHECK(o.beta2 >= 0 && o.beta2 < 1,
           "AdamW: beta2 must be in [0, 1), got " + std::to_string(o.beta2));
  FT_CHECK(o.eps >= 0 && std::isfinite(o.eps),
           "AdamW: eps must be >= 0, got " + std::to_string(o.eps));
  FT_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay),
           "AdamW: weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
  FT_CHECK(o.state_dtype == DType::F32 || o.state_dtype == DType::BF16,
           std::string("AdamW: state_dtype must be F32 or BF16, got ") + dtype_name(o.state_dtype));
}

DType AdamW::moment_dtype(DType param) const {
  if (options_.state_dtype != DType::BF16) return param == DType::F64 ? DType::F64 : DType::F32;
  FT_CHECK(param != DType::F64,
           "AdamW: optimizer.state_dtype bf16 is for F32 and BF16 parameters, not F64 ones");
  return DType::BF16;
}

void AdamW::step(const std::vector<ParamRef>& params, double lr) {
  optim_detail::check_lr(lr, "AdamW");
  check_params(params, "AdamW");
  // Validate everything before touching anything, so a bad call leaves no half-done step.
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const DType md = moment_dtype(p.value->dtype());  // F64 with bf16 state: throws here
    auto it = state_.find(p.name);
    if (it == state_.end()) continue;
    const Tensor& m = it->second.exp_avg;
    FT_CHECK(m.shape() == p.value->shape() && m.dtype() == md,
             "AdamW: parameter '" + p.name + "' is " + dtype_name(p.value->dtype()) + " " +
                 shape_str(p.value->shape()) + " but its optimizer state is " +
                 dtype_name(m.dtype()) + " " + shape_str(m.shape()));
  }
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const Tensor& value = *p.value;
    const DType pd = value.dtype(), md = moment_dtype(pd);
    State& s = state_[p.name];
    if (!s.exp_avg.defined()) {  // lazily, so the memory shows up when training starts
      s.exp_avg = Tensor::zeros(value.shape(), md);
      s.exp_avg_sq = Tensor::zeros(value.shape(), md);
      s.active_rows.assign(size_t(row_shape(value).rows), 0);
    }
    s.step += 1;
    const adamw_math::Coefficients c = adamw_math::coefficients(options_, lr, s.step);
    const bf16::Stream r(options_.seed, s.step, p.name);  // bf16 stores only
    Tensor &m = s.exp_avg, &v = s.exp_avg_sq;
    uint8_t* active = s.active_rows.data();
    if (pd == DType::F64)
      update_tensors<double, double, double>(value, *p.grad, m, v, active, c, r);
    else if (pd == DType::F32 && md == DType::F32)
      update_tensors<float, float, float>(value, *p.grad, m, v, active, c, r);
    else if (pd == DType::F32)
      update_tensors<float, float, uint16_t>(value, *p.grad, m, v, active, c, r);
    else if (md == DType::F32)
      update_tensors<float, uint16_t, float>(value, *p.grad, m, v, active, c, r);
    else
      update_tensors<float, uint16_t, uint16_t>(value, *p.grad, m, v, active, c, r);
  }
}

void AdamW::save_state(NamedTensors& out) const {
  for (const auto& [name, s] : state_) {
    out.emplace_back(name + ".exp_avg", s.exp_avg);
    out.emplace_back(name + ".exp_avg_sq", s.exp_avg_sq);
    out.emplace_back(name + ".step", optim_detail::step_tensor(s.step));
  }
}

void AdamW::load_state(const StateMap& state, const std::vector<ParamRef>& params) {
  check_params(params, "AdamW");
  std::map<std::string, State> loaded;
  if (!state.empty()) {
    optim_detail::StateReader reader(state, "AdamW");
    for (const ParamRef& p : params) {
      const DType md = moment_dtype(p.value->dtype());
      for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {  // the clear message first
        auto it = state.find(p.name + suffix);
        if (it == state.end() || !it->second.defined() || it->second.dtype() == md) continue;
        throw Error("AdamW state: entry '" + it->first + "' is " + dtype_name(it->second.dtype()) +
                    ", expected " + dtype_name(md) + " (with optimizer.state_dtype " +
                    (options_.state_dtype == DType::BF16 ? "bf16" : "fp32") + ", the moments of " +
                    dtype_name(p.value->dtype()) + " parameter '" + p.name + "' are " +
                    dtype_name(md) +
                    "); resume with the state_dtype (and dtype) the state was saved with");
      }
      State s;
      s.exp_avg = reader.tensor(p.name + ".exp_avg", p.value->shape(), md);
      s.exp_avg_sq = reader.tensor(p.name + ".exp_avg_sq", p.value->shape(), md);
      s.step = reader.step(p.name + ".step");
      s.active_rows = active_rows(s.exp_avg, s.exp_avg_sq, row_shape(*p.value));
      loaded.emplace(p.name, std::move(s));
    }
    reader.expect_all_consumed();
  }
  state_ = std::move(loaded);
}

int64_t AdamW::state_bytes() const {
  int64_t total = 0;
  for (const auto& kv : state_) total += int64_t(kv.second.exp_avg.nbytes() * 2);
  return total;
}

int64_t AdamW::step_count(const std::string& param) const {
  auto it = state_.find(param);
  return it == state_.end() ? 0 : it->second.step;
}

}  // namespace fusetune
