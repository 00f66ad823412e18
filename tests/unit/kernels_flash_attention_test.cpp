// The tiled flash-attention kernels against the unfused eager ops they replace (transpose,
// repeat_heads, matmul, scale, causal_mask, softmax, matmul, transpose and autodiff's backward
// of them), in float32 and float64, with GQA, ragged tiles, document masks and Gemma 2's sliding
// window and soft-capped scores; and the backward against central finite differences of the
// forward in float64.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fusetune/graph/autodiff.h"
#include "fusetune/graph/builder.h"
#include "fusetune/kernels/cpu/flash_attention.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct Case {
  std::string name;
  int64_t B, T, H, KV, hd;
  std::vector<int32_t> docs;  // [B*T] or empty: no document mask
  int64_t window = 0;         // Gemma 2: sliding window (0: none)
  double softcap = 0.0;       // and the scores' soft-cap (0: none)
};

template <class T>
struct Attn {
  std::vector<T> o, lse, dq, dk, dv;
};

template <class T>
Tensor tensor_of(const std::vector<T>& v, Shape s) {
  Tensor t = Tensor::empty(std::move(s), dtype_of<T>());
  std::copy(v.begin(), v.end(), t.data<T>());
  return t;
}

template <class T>
std::vector<T> vec_of(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

double scale_of(const Case& c) { return 1.0 / std::sqrt(double(c.hd)); }

// Eager: the ops models/llama.cpp builds, and autodiff's backward of <o, dout>.
template <class T>
Attn<T> eager(const Case& c, const std::vector<T>& q, const std::vector<T>& k,
              const std::vector<T>& v, const std::vector<T>& dout) {
  Graph g(dtype_of<T>());
  Builder b(g);
  const Shape qs{c.B, c.T, c.H, c.hd}, ks{c.B, c.T, c.KV, c.hd};
  Value qv = g.param("q", qs, true), kv = g.param("k", ks, true), vv = g.param("v", ks, true);
  Value dov = g.input("dout", qs, dtype_of<T>());
  Value doc = c.docs.empty() ? Value{} : g.input("doc_ids", {c.B, c.T}, DType::I32);
  Value qt = b.transpose(qv, 1, 2);
  Value kt = b.repeat_heads(b.transpose(kv, 1, 2), c.H / c.KV);
  Value vt = b.repeat_heads(b.transpose(vv, 1, 2), c.H / c.KV);
  Value scores = b.scale(b.matmul(qt, kt, false, true), scale_of(c));
  if (c.softcap > 0) scores = b.softcap(scores, c.softcap);
  Value probs = b.softmax(b.causal_mask(scores, doc, c.window));
  Value o = b.transpose(b.matmul(probs, vt), 1, 2);
  g.mark_output("o", o);
  append_backward(g, b.sum(b.mul(o, dov)));
  TensorMap params{{"q", tensor_of(q, qs)}, {"k", tensor_of(k, ks)}, {"v", tensor_of(v, ks)}};
  TensorMap inputs{{"dout", tensor_of(dout, qs)}};
  if (!c.docs.empty()) inputs["doc_ids"] = tensor_of(c.docs, {c.B, c.T});
  auto out = EagerExecutor(g).run(inputs, params);
  return {vec_of<T>(out[0]), {}, vec_of<T>(out[1]), vec_of<T>(out[2]), vec_of<T>(out[3])};
}

kernels::AttentionDims dims_of(const Case& c) {
  return {c.B, c.T, c.H, c.KV, c.hd, c.window, c.softcap};
}

template <class T>
Attn<T> fused(const Case& c, const std::vector<T>& q, const std::vector<T>& k,
              const std::vector<T>& v, const std::vector<T>& dout, bool backward = true) {
  Attn<T> r;
  r.o.resize(q.size());
  r.lse.resize(size_t(c.B * c.H * c.T));
  const int32_t* docs = c.docs.empty() ? nullptr : c.docs.data();
  kernels::flash_attention_forward<T>(q.data(), k.data(), v.data(), docs, r.o.data(), r.lse.data(),
                                      dims_of(c), scale_of(c));
  if (!backward) return r;
  // Garbage in the outputs: the kernel must overwrite, not accumulate.
  r.dq.assign(q.size(), T(7));
  r.dk.assign(k.size(), T(7));
  r.dv.assign(v.size(), T(7));
  kernels::flash_attention_backward<T>(q.data(), k.data(), v.data(), r.o.data(), r.lse.data(),
                                       dout.data(), docs, r.dq.data(), r.dk.data(), r.dv.data(),
                                       dims_of(c), scale_of(c));
  return r;
}

// logsumexp of each visible score row, in double.
std::vector<double> reference_lse(const Case& c, const std::vector<double>& q,
                                  const std::vector<double>& k) {
  std::vector<double> lse(size_t(c.B * c.H * c.T));
  const int64_t G = c.H / c.KV;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.T; ++i) {
        std::vector<double> s;
        for (int64_t j = 0; j <= i; ++j) {
          if (!c.docs.empty() && c.docs[size_t(b * c.T + j)] != c.docs[size_t(b * c.T + i)])
            continue;
          if (c.window > 0 && i - j >= c.window) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.hd; ++d)
            dot += q[size_t(((b * c.T + i) * c.H + h) * c.hd + d)] *
                   k[size_t(((b * c.T + j) * c.KV + h / G) * c.hd + d)];
          const double x = dot * scale_of(c);
          s.push_back(c.softcap > 0 ? c.softcap * std::tanh(x / c.softcap) : x);
        }
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (double x : s) m = std::max(m, x);
        for (double x : s) sum += std::exp(x - m);
        lse[size_t((b * c.H + h) * c.T + i)] = m + std::log(sum);
      }
  return lse;
}

// Documents given by their lengths, per batch row (each row's lengths sum to T).
std::vector<int32_t> docs_from_lengths(const std::vector<std::vector<int>>& rows) {
  std::vector<int32_t> d;
  for (const auto& lens : rows) {
    int32_t id = 0;
    for (int len : lens) {
      for (int i = 0; i < len; ++i) d.push_back(id);
      ++id;
    }
  }
  return d;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int64_t kv : {4, 2, 1}) {  // GQA groups 1, 2, 4
    all.push_back({"dense_kv" + std::to_string(kv), 2, 150, 4, kv, 8, {}});
  }
  // T not a multiple of either tile; documents of length 1 at the start, middle and end.
  all.push_back(
      {"docs_gqa2", 2, 150, 4, 2, 8, docs_from_lengths({{1, 37, 1, 1, 60, 49, 1}, {150}})});
  all.push_back({"docs_mqa", 2, 131, 4, 1, 16, docs_from_lengths({{64, 1, 66}, {1, 1, 1, 128}})});
  // Ids that are not sorted: same-document keys are not contiguous (the eager mask allows it).
  std::vector<int32_t> scattered;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 140; ++t) scattered.push_back(int32_t((t * 7 + b) % 3));
  all.push_back({"docs_scattered", 2, 140, 2, 2, 8, scattered});
  all.push_back({"tiny", 1, 3, 2, 1, 4, {}});
  // Gemma 2: windows shorter than a tile, across tiles, with documents; caps that bite (the
  // scores reach about +-4 here) and with a window.
  all.push_back({"window_5", 2, 150, 4, 2, 8, {}, 5});
  all.push_back({"window_70_docs", 2, 150, 4, 1, 8,
                 docs_from_lengths({{1, 37, 1, 1, 60, 49, 1}, {150}}), 70});
  all.push_back({"softcap", 2, 131, 4, 2, 8, {}, 0, 1.5});
  all.push_back(
      {"softcap_window_docs", 2, 140, 4, 2, 8, docs_from_lengths({{64, 1, 75}, {140}}), 66, 2.0});
  return all;
}

template <class T>
void check_against_eager(double rtol, double atol) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto q = random_vec<T>(c.B * c.T * c.H * c.hd, 1, -2, 2);
    const auto k = random_vec<T>(c.B * c.T * c.KV * c.hd, 2, -2, 2);
    const auto v = random_vec<T>(c.B * c.T * c.KV * c.hd, 3);
    const auto dout = random_vec<T>(c.B * c.T * c.H * c.hd, 4);
    const Attn<T> want = eager<T>(c, q, k, v, dout);
    const Attn<T> got = fused<T>(c, q, k, v, dout);
    expect_close(got.o, want.o, rtol, atol, "o");
    expect_close(got.lse, reference_lse(c, to_double(q), to_double(k)), rtol, atol, "lse");
    expect_close(got.dq, want.dq, rtol, atol, "dq");
    expect_close(got.dk, want.dk, rtol, atol, "dk");
    expect_close(got.dv, want.dv, rtol, atol, "dv");
  }
}

}  // namespace

TEST(KernelsFlashAttention, MatchesEagerOpsInFloat64) { check_against_eager<double>(1e-11, 1e-12); }

TEST(KernelsFlashAttention, MatchesEagerOpsInFloat32) { check_against_eager<float>(2e-5, 2e-6); }

TEST(KernelsFlashAttention, BackwardMatchesFiniteDifferencesInFloat64) {
  // Small head dims keep the number of perturbed elements down; T = 135 spans two key tiles.
  for (const Case& c :
       {Case{"mqa_docs", 1, 135, 2, 1, 2, docs_from_lengths({{1, 60, 1, 73}})},
        Case{"gqa2", 1, 70, 4, 2, 2, {}}, Case{"softcap_window", 1, 135, 2, 1, 2, {}, 70, 0.7}}) {
    SCOPED_TRACE(c.name);
    const int64_t nq = c.B * c.T * c.H * c.hd, nk = c.B * c.T * c.KV * c.hd;
    // x = q ++ k ++ v; the forward returns o.
    auto split = [&](const std::vector<double>& x) {
      return std::array<std::vector<double>, 3>{
          std::vector<double>(x.begin(), x.begin() + nq),
          std::vector<double>(x.begin() + nq, x.begin() + nq + nk),
          std::vector<double>(x.begin() + nq + nk, x.end())};
    };
    auto forward = [&](const std::vector<double>& x) {
      auto [q, k, v] = split(x);
      return fused<double>(c, q, k, v, {}, false).o;
    };
    auto backward = [&](const std::vector<double>& x, const std::vector<double>& dy) {
      auto [q, k, v] = split(x);
      Attn<double> r = fused<double>(c, q, k, v, dy);
      std::vector<double> dx = r.dq;
      dx.insert(dx.end(), r.dk.begin(), r.dk.end());
      dx.insert(dx.end(), r.dv.begin(), r.dv.end());
      return dx;
    };
    // One thread: thousands of tiny calls, each an OpenMP fork/join otherwise.
    with_threads(1, [&] {
      expect_vjp_matches_fd(random_vec(nq + 2 * nk, 9, -1.5, 1.5), nq, forward, backward,
                            c.name.c_str());
    });
  }
}

TEST(KernelsFlashAttention, DeterministicAcrossRunsAndThreadCounts) {
  const Case c{"docs", 3, 200, 4, 2, 16, {}};
  Case cd = c;
  cd.docs = docs_from_lengths({{100, 100}, {1, 199}, {200}});
  for (const Case& cs : {c, cd}) {
    const auto q = random_vec<float>(cs.B * cs.T * cs.H * cs.hd, 1);
    const auto k = random_vec<float>(cs.B * cs.T * cs.KV * cs.hd, 2);
    const auto v = random_vec<float>(cs.B * cs.T * cs.KV * cs.hd, 3);
    const auto dout = random_vec<float>(cs.B * cs.T * cs.H * cs.hd, 4);
    Attn<float> a = fused<float>(cs, q, k, v, dout), b = fused<float>(cs, q, k, v, dout), one;
    with_threads(1, [&] { one = fused<float>(cs, q, k, v, dout); });
    for (const Attn<float>* r : {&b, &one}) {
      EXPECT_TRUE(bitwise_equal(a.o, r->o));
      EXPECT_TRUE(bitwise_equal(a.lse, r->lse));
      EXPECT_TRUE(bitwise_equal(a.dq, r->dq));
      EXPECT_TRUE(bitwise_equal(a.dk, r->dk));
      EXPECT_TRUE(bitwise_equal(a.dv, r->dv));
    }
  }
}

TEST(KernelsFlashAttention, RejectsHeadsNotAMultipleOfKvHeads) {
  const Case c{"bad", 1, 4, 3, 2, 4, {}};
  std::vector<float> q(48), k(32), v(32), o(48), lse(12);
  EXPECT_THROW(kernels::flash_attention_forward<float>(q.data(), k.data(), v.data(), nullptr,
                                                       o.data(), lse.data(), dims_of(c), 0.5),
               Error);
}
