#include "fusetune/optim/adamw8bit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "fusetune/optim/adamw_math.h"
#include "fusetune/optim/parallel_min.h"
#include "fusetune/optim/stochastic_rounding.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace q8 {
namespace {

// create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for each exponent i in 0..6,
// the midpoints of linspace(0.1, 1, k + 1) scaled by 10^(i - 6), where k = 2^i fraction values
// (signed, both signs) or 2^(i+1) (unsigned, positive only); then 0 and 1; sorted. Both maps
// have exactly 256 values.
std::vector<float> build_map(bool is_signed) {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int k = is_signed ? (1 << i) : (1 << (i + 1));
    for (int j = 0; j < k; ++j) {
      const double b0 = 0.1 + 0.9 * double(j) / double(k);
      const double b1 = 0.1 + 0.9 * double(j + 1) / double(k);
      const double v = std::pow(10.0, double(i - 6)) * (b0 + b1) / 2.0;
      data.push_back(float(v));
      if (is_signed) data.push_back(float(-v));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  FT_CHECK(data.size() == 256, "8-bit dynamic map: expected 256 values");
  std::sort(data.begin(), data.end());
  return data;
}

}  // namespace

namespace {

// The nearest-code search, by table: floats are bucketed by their top 16 bits (sign, exponent,
// 7 mantissa bits; the order of finite floats of one sign follows their bits), and each bucket
// stores where std::lower_bound's answer for the bucket's smallest value is. A lookup then
// steps over the (at most a few) map values inside the bucket: the same answer as
// std::lower_bound, without the 8 dependent comparisons of a binary search.
struct CodeBook {
  std::vector<float> map;
  std::vector<uint16_t> start;  // 65536 buckets
  explicit CodeBook(bool is_signed) : map(build_map(is_signed)), start(size_t(1) << 16) {
    for (uint32_t key = 0; key < (1u << 16); ++key) {
      // The bucket's smallest value: positive floats grow with their bits, negative ones
      // shrink, so it is the first pattern of a positive bucket, the last of a negative one.
      const bool negative = key >> 15;
      const uint32_t bits = negative ? (key << 16) | 0xffffu : key << 16;
      float lo;
      std::memcpy(&lo, &bits, sizeof lo);
      if (std::isnan(lo)) lo = negative ? -INFINITY : INFINITY;  // NaN patterns: the ends
      start[key] = uint16_t(std::lower_bound(map.begin(), map.end(), lo) - map.begin());
    }
  }
  int nearest(float v) const {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    int hi = start[bits >> 16];
    while (hi < 256 && map[size_t(hi)] < v) ++hi;
    if (hi == 0) return 0;
    if (hi == 256) return 255;
    return (v - map[size_t(hi - 1)]) <= (map[size_t(hi)] - v) ? hi - 1 : hi;
  }
};

const CodeBook& code_book(bool is_signed) {
  static const CodeBook s(true), u(false);
  return is_signed ? s : u;
}

}  // namespace

const float* dynamic_map(bool is_signed) { return code_book(is_signed).map.data(); }

int nearest_code(const float* map, float v) {
  if (map == code_book(true).map.data()) return code_book(true).nearest(v);
  if (map == code_book(false).map.data()) return code_book(false).nearest(v);
  const int hi = int(std::lower_bound(map, map + 256, v) - map);
  if (hi == 0) return 0;
  if (hi == 256) return 255;
  return (v - map[hi - 1]) <= (map[hi] - v) ? hi - 1 : hi;
}

namespace {
inline int zero_code(const float* map) { return nearest_code(map, 0.0f); }
}  // namespace

void quantize_blockwise(const float* x, int64_t n, const float* map, int64_t block, uint8_t* codes,
                        float* absmax) {
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t i0 = b * block, i1 = std::min(n, i0 + block);
    float am = 0;
    for (int64_t i = i0; i < i1; ++i) am = std::max(am, std::abs(x[i]));
    absmax[b] = am;
    for (int64_t i = i0; i < i1; ++i)
      codes[i] = uint8_t(am > 0 ? nearest_code(map, x[i] / am) : zero_code(map));
  }
}

void dequantize_blockwise(const uint8_t* codes, const float* absmax, int64_t n, const float* map,
                          int64_t block, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / block];
}

}  // namespace q8

namespace {

// One block of an 8-bit parameter: dequantize, AdamW's update (adamw_math::Update, which
// adamw.cpp runs too), requantize with the block's new absmax.
template <class T>
void update_block(T* p, const T* g, uint8_t* c1, uint8_t* c2, float* absmax1, float* absmax2,
                  int64_t n, const adamw_math::Coefficients& c, T* m, T* v) {
  const q8::CodeBook& book1 = q8::code_book(true);
  const q8::CodeBook& book2 = q8::code_book(false);
  const float* map1 = book1.map.data();
  const float* map2 = book2.map.data();
  const adamw_math::Update<T> update(c);
  const T a1 = T(*absmax1), a2 = T(*absmax2);
  T max1 = 0, max2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    m[i] = T(map1[c1[i]]) * a1;
    v[i] = T(map2[c2[i]]) * a2;
    update(p[i], g[i], m[i], v[i]);
    max1 = std::max(max1, std::abs(m[i]));
    max2 = std::max(max2, v[i]);
  }
  *absmax1 = float(max1);
  *absmax2 = float(max2);
  // Divide by the stored (fp32) absmax: what dequantization will multiply by.
  const T s1 = T(*absmax1), s2 = T(*absmax2);
  const int z1 = book1.nearest(0.0f), z2 = book2.nearest(0.0f);
  for (int64_t i = 0; i < n; ++i) {
    c1[i] = uint8_t(s1 > 0 ? book1.nearest(float(m[i] / s1)) : z1);
    c2[i] = uint8_t(s2 > 0 ? book2.nearest(float(v[i] / s2)) : z2);
  }
}

template <class T>
void update_8bit(T* p, const T* g, uint8_t* c1, uint8_t* c2, float* absmax1, float* absmax2,
                 int64_t n, const adamw_math::Coefficients& c) {
  const int64_t blocks = (n + q8::kBlock - 1) / q8::kBlock;
#pragma omp parallel if (n >= kOptimizerParallelMin)
  {
    std::vector<T> m(static_cast<size_t>(q8::kBlock)), v(static_cast<size_t>(q8::kBlock));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i0 = b * q8::kBlock, len = std::min(q8::kBlock, n - i0);
      update_block(p + i0, g + i0, c1 + i0, c2 + i0, absmax1 + b, absmax2 + b, len, c, m.data(),
                   v.data());
    }
  }
}

// BF16 parameters: each block is widened to fp32, updated as an F32 parameter's block, and
// written back with stochastic rounding (the moments stay 8-bit).
void update_8bit_bf16(uint16_t* p, const uint16_t* g, uint8_t* c1, uint8_t* c2, float* absmax1,
                      float* absmax2, int64_t n, const adamw_math::Coefficients& c,
                      const bf16::Stream& round) {
  const int64_t blocks = (n + q8::kBlock - 1) / q8::kBlock;
#pragma omp parallel if (n >= kOptimizerParallelMin)
  {
    const size_t len_max = static_cast<size_t>(q8::kBlock);
    std::vector<float> m(len_max), v(len_max), pf(len_max), gf(len_max);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i0 = b * q8::kBlock, len = std::min(q8::kBlock, n - i0);
      for (int64_t j = 0; j < len; ++j) {
        pf[size_t(j)] = bf16::to_f32(p[i0 + j]);
        gf[size_t(j)] = bf16::to_f32(g[i0 + j]);
      }
      update_block(pf.data(), gf.data(), c1 + i0, c2 + i0, absmax1 + b, absmax2 + b, len, c,
                   m.data(), v.data());
      for (int64_t j = 0; j < len; ++j)
        p[i0 + j] = round.round(pf[size_t(j)], i0 + j, bf16::Buffer::Value);
    }
  }
}

int64_t code_words(int64_t numel) { return (numel + 3) / 4; }
int64_t num_blocks(int64_t numel) { return (numel + q8::kBlock - 1) / q8::kBlock; }
uint8_t* bytes(const Tensor& t) { return reinterpret_cast<uint8_t*>(t.data<int32_t>()); }

}  // namespace

AdamW8bit::AdamW8bit(AdamW8bitOptions options)
    : options_(options), small_(options.adamw) {  // AdamW checks betas, eps, weight_decay
  FT_CHECK(options_.min_8bit_size >= 1,
           "AdamW8bit: min_8bit_size must be >= 1, got " + std::to_string(options_.min_8bit_size));
  FT_CHECK(options_.adamw.state_dtype == DType::F32,
           "AdamW8bit: optimizer.state_dtype bf16 has no meaning here: the moments are stored in "
           "8 bits (parameters below min_8bit_size keep fp32 moments); remove the key or set it "
           "to fp32");
}

int64_t AdamW8bit::state_bytes_for(int64_t numel, int64_t elem_bytes, int64_t min_8bit_size) {
  // Small parameters keep AdamW's moments: F64 for F64 parameters, else F32 (BF16 too).
  if (numel < min_8bit_size) return 2 * numel * (elem_bytes == 8 ? 8 : 4);
  return 2 * (code_words(numel) * 4 + num_blocks(numel) * 4);
}

void AdamW8bit::step(const std::vector<ParamRef>& params, double lr) {
  optim_detail::check_lr(lr, "AdamW8bit");
  check_params(params, "AdamW8bit");
  std::vector<ParamRef> small;
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    if (!is_quantized(p.value->numel())) {
      small.push_back(p);
      continue;
    }
    auto it = state_.find(p.name);
    FT_CHECK(it == state_.end() || it->second.codes1.numel() == code_words(p.value->numel()),
             "AdamW8bit: parameter '" + p.name + "' has " + std::to_string(p.value->numel()) +
                 " elements but its optimizer state was made for another size");
  }
  if (!small.empty()) small_.step(small, lr);
  for (const ParamRef& p : params) {
    if (!has_grad(p) || !is_quantized(p.value->numel())) continue;
    const Tensor& value = *p.value;
    const int64_t n = value.numel();
    State& s = state_[p.name];
    if (!s.codes1.defined()) {  // zero absmax: every moment dequantizes to 0
      s.codes1 = Tensor::zeros({code_words(n)}, DType::I32);
      s.codes2 = Tensor::zeros({code_words(n)}, DType::I32);
      s.absmax1 = Tensor::zeros({num_blocks(n)}, DType::F32);
      s.absmax2 = Tensor::zeros({num_blocks(n)}, DType::F32);
    }
    s.step += 1;
    const adamw_math::Coefficients c = adamw_math::coefficients(options_.adamw, lr, s.step);
    uint8_t* c1 = bytes(s.codes1);
    uint8_t* c2 = bytes(s.codes2);
    float* a1 = s.absmax1.data<float>();
    float* a2 = s.absmax2.data<float>();
    if (value.dtype() == DType::F32)
      update_8bit(value.data<float>(), p.grad->data<float>(), c1, c2, a1, a2, n, c);
    else if (value.dtype() == DType::BF16)
      update_8bit_bf16(value.data<uint16_t>(), p.grad->data<uint16_t>(), c1, c2, a1, a2, n, c,
                       bf16::Stream(options_.adamw.seed, s.step, p.name));
    else
      update_8bit(value.data<double>(), p.grad->data<double>(), c1, c2, a1, a2, n, c);
  }
}

void AdamW8bit::save_state(NamedTensors& out) const {
  NamedTensors all;
  small_.save_state(all);
  for (const auto& [name, s] : state_) {
    all.emplace_back(name + ".absmax1", s.absmax1);
    all.emplace_back(name + ".absmax2", s.absmax2);
    all.emplace_back(name + ".state1", s.codes1);
    all.emplace_back(name + ".state2", s.codes2);
    all.emplace_back(name + ".step", optim_detail::step_tensor(s.step));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& e : all) out.push_back(std::move(e));
}

void AdamW8bit::load_state(const StateMap& state, const std::vector<ParamRef>& params) {
  check_params(params, "AdamW8bit");
  std::vector<ParamRef> small;
  StateMap small_state, big_state;
  for (const ParamRef& p : params)
    if (!is_quantized(p.value->numel())) small.push_back(p);
  {  // AdamW's entries of the small parameters go to AdamW, everything else is ours
    std::set<std::string> small_keys;
    for (const ParamRef& p : small)
      for (const char* suffix : {".exp_avg", ".exp_avg_sq", ".step"})
        small_keys.insert(p.name + suffix);
    for (const auto& [key, t] : state) (small_keys.count(key) ? small_state : big_state)[key] = t;
  }
  std::map<std::string, State> loaded;
  if (!state.empty()) {
    optim_detail::StateReader reader(big_state, "AdamW8bit");
    for (const ParamRef& p : params) {
      const int64_t n = p.value->numel();
      if (!is_quantized(n)) continue;
      State s;
      s.absmax1 = reader.tensor(p.name + ".absmax1", {num_blocks(n)}, DType::F32);
      s.absmax2 = reader.tensor(p.name + ".absmax2", {num_blocks(n)}, DType::F32);
      s.codes1 = reader.tensor(p.name + ".state1", {code_words(n)}, DType::I32);
      s.codes2 = reader.tensor(p.name + ".state2", {code_words(n)}, DType::I32);
      s.step = reader.step(p.name + ".step");
      for (const Tensor* a : {&s.absmax1, &s.absmax2})
        for (int64_t b = 0; b < a->numel(); ++b)
          FT_CHECK(std::isfinite(a->data<float>()[b]) && a->data<float>()[b] >= 0,
                   "AdamW8bit state: an absmax of '" + p.name +
                       "' is negative or not finite: the state is damaged");
      loaded.emplace(p.name, std::move(s));
    }
    reader.expect_all_consumed();
    if (small_state.empty() && !small.empty())  // as AdamW would: every parameter needs state
      throw Error("AdamW8bit state: missing entry '" + small.front().name +
                  ".exp_avg'; was this state saved by another optimizer or for other "
                  "parameters?");
  }
  small_.load_state(small_state, small);  // validates before replacing: may throw
  state_ = std::move(loaded);
}

int64_t AdamW8bit::state_bytes() const {
  int64_t total = small_.state_bytes();
  for (const auto& kv : state_)
    total += int64_t(kv.second.codes1.nbytes() + kv.second.codes2.nbytes() +
                     kv.second.absmax1.nbytes() + kv.second.absmax2.nbytes());
  return total;
}

int64_t AdamW8bit::step_count(const std::string& param) const {
  auto it = state_.find(param);
  return it == state_.end() ? small_.step_count(param) : it->second.step;
}

}  // namespace fusetune
