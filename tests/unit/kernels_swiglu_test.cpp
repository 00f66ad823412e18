// The fused SwiGLU and RMSNorm+residual kernels: against the unfused kernels they replace
// (float and double), against float64 finite differences, thread-count determinism, and
// bad sizes.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/rmsnorm_fused.h"
#include "fusetune/kernels/cpu/swiglu.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

// Sizes below and above the OpenMP threshold (kParallelMin = 32768 elements).
const int64_t kSwigluSizes[] = {1, 7, 1000, 70001};

template <class T>
void swiglu_matches_unfused(double rtol) {
  for (int64_t n : kSwigluSizes) {
    const auto g = random_vec<T>(n, 1, -12.0, 12.0);
    const auto u = random_vec<T>(n, 2, -3.0, 3.0);
    const auto dy = random_vec<T>(n, 3, -2.0, 2.0);
    std::vector<T> s(n), p(n), ds(n), dg(n), du(n);
    kernels::silu<T>(g.data(), s.data(), n);
    kernels::mul<T>(s.data(), u.data(), p.data(), n, n);
    kernels::mul<T>(dy.data(), u.data(), ds.data(), n, n);
    kernels::silu_backward<T>(g.data(), ds.data(), dg.data(), n);
    kernels::mul<T>(dy.data(), s.data(), du.data(), n, n);

    std::vector<T> fp(n), fdg(n), fdu(n);
    kernels::swiglu<T>(g.data(), u.data(), fp.data(), n);
    kernels::swiglu_backward<T>(g.data(), u.data(), dy.data(), fdg.data(), fdu.data(), n);
    expect_close(fp, p, rtol, 1e-30, "swiglu");
    expect_close(fdg, dg, rtol, 1e-30, "swiglu_backward dg");
    expect_close(fdu, du, rtol, 1e-30, "swiglu_backward du");
  }
}

template <class T>
void add_rmsnorm_matches_unfused(double rtol) {
  for (auto [rows, D] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {67, 3}, {300, 257}}) {
    const int64_t n = rows * D;
    const auto h = random_vec<T>(n, 4, -3.0, 3.0);
    const auto x = random_vec<T>(n, 5, -3.0, 3.0);
    const auto w = random_vec<T>(D, 6, 0.5, 1.5);
    const auto dy = random_vec<T>(n, 7, -1.0, 1.0);
    const auto dres = random_vec<T>(n, 8, -1.0, 1.0);
    // Unfused: add, rmsnorm; rmsnorm_backward, add.
    std::vector<T> s(n), y(n), dx(n), dw(D), dsum(n);
    kernels::add<T>(h.data(), x.data(), s.data(), n, n);
    kernels::rmsnorm_forward<T>(s.data(), w.data(), y.data(), rows, D, 1e-5);
    kernels::rmsnorm_backward<T>(s.data(), w.data(), dy.data(), dx.data(), dw.data(), rows, D,
                                 1e-5);
    kernels::add<T>(dres.data(), dx.data(), dsum.data(), n, n);

    std::vector<T> fs(n), fy(n), fdx(n), fdw(D);
    kernels::add_rmsnorm_forward<T>(h.data(), x.data(), w.data(), fs.data(), fy.data(), rows, D,
                                    1e-5);
    kernels::rmsnorm_backward_add<T>(fs.data(), w.data(), dy.data(), dres.data(), fdx.data(),
                                     fdw.data(), rows, D, 1e-5);
    EXPECT_TRUE(bitwise_equal(fs, s)) << "the sum is the same float add";
    expect_close(fy, y, rtol, 1e-30, "add_rmsnorm y");
    expect_close(fdx, dsum, rtol, rtol, "rmsnorm_backward_add dx");
    // dw is computed exactly as rmsnorm_backward computes it.
    EXPECT_TRUE(bitwise_equal(fdw, dw)) << rows << "x" << D;
  }
}

}  // namespace

TEST(KernelsSwiglu, MatchesSiluTimesUpInFloatAndDouble) {
  swiglu_matches_unfused<float>(1e-6);
  swiglu_matches_unfused<double>(1e-14);
}

TEST(KernelsSwiglu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 23;
  const auto g = random_vec(n, 11, -6.0, 6.0);
  const auto u = random_vec(n, 12, -2.0, 2.0);
  auto fwd = [&](const std::vector<double>& gs, const std::vector<double>& us) {
    std::vector<double> p(n);
    kernels::swiglu<double>(gs.data(), us.data(), p.data(), n);
    return p;
  };
  auto bwd = [&](const std::vector<double>& gs, const std::vector<double>& us,
                 const std::vector<double>& dy) {
    std::vector<double> dg(n), du(n);
    kernels::swiglu_backward<double>(gs.data(), us.data(), dy.data(), dg.data(), du.data(), n);
    return std::make_pair(dg, du);
  };
  expect_vjp_matches_fd(
      g, n, [&](const std::vector<double>& gs) { return fwd(gs, u); },
      [&](const std::vector<double>& gs, const std::vector<double>& dy) {
        return bwd(gs, u, dy).first;
      },
      "swiglu dg");
  expect_vjp_matches_fd(
      u, n, [&](const std::vector<double>& us) { return fwd(g, us); },
      [&](const std::vector<double>& us, const std::vector<double>& dy) {
        return bwd(g, us, dy).second;
      },
      "swiglu du");
}

TEST(KernelsSwiglu, ExtremeGatesStayFinite) {
  // silu(-inf side) -> -0, silu(+large) -> g; never NaN (as the unfused silu).
  const std::vector<float> g{-200.f, -90.f, 0.f, 90.f, 200.f}, u(5, 2.f), dy(5, 1.f);
  std::vector<float> p(5), dg(5), du(5);
  kernels::swiglu<float>(g.data(), u.data(), p.data(), 5);
  kernels::swiglu_backward<float>(g.data(), u.data(), dy.data(), dg.data(), du.data(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::isfinite(p[i]) && std::isfinite(dg[i]) && std::isfinite(du[i])) << g[i];
  }
  EXPECT_FLOAT_EQ(p[4], 400.f);
  EXPECT_FLOAT_EQ(dg[4], 2.f);
  EXPECT_EQ(p[0], 0.f);
}

TEST(KernelsRmsnormFused, MatchesAddThenRmsnormInFloatAndDouble) {
  add_rmsnorm_matches_unfused<float>(1e-5);
  add_rmsnorm_matches_unfused<double>(1e-13);
}

TEST(KernelsRmsnormFused, BackwardAddMatchesFiniteDifferences) {
  const int64_t rows = 4, D = 6, n = rows * D;
  const double eps = 1e-3;
  const auto h = random_vec(n, 21, -2.0, 2.0);
  const auto x = random_vec(n, 22, -2.0, 2.0);
  const auto w = random_vec(D, 23, 0.5, 1.5);
  // f(h) = (s, y) with s = h + x, y = rmsnorm(s): the VJP with cotangents (ds, dy) is
  // ds + rmsnorm_backward(s, w, dy).dx, which is what rmsnorm_backward_add computes.
  expect_vjp_matches_fd(
      h, 2 * n,
      [&](const std::vector<double>& hs) {
        std::vector<double> sy(2 * n);
        kernels::add_rmsnorm_forward<double>(hs.data(), x.data(), w.data(), sy.data(),
                                             sy.data() + n, rows, D, eps);
        return sy;
      },
      [&](const std::vector<double>& hs, const std::vector<double>& dsy) {
        std::vector<double> s(n), y(n), dh(n), dw(D);
        kernels::add_rmsnorm_forward<double>(hs.data(), x.data(), w.data(), s.data(), y.data(),
                                             rows, D, eps);
        kernels::rmsnorm_backward_add<double>(s.data(), w.data(), dsy.data() + n, dsy.data(),
                                              dh.data(), dw.data(), rows, D, eps);
        return dh;
      },
      "add_rmsnorm dh");
  expect_vjp_matches_fd(
      w, n,
      [&](const std::vector<double>& ws) {
        std::vector<double> s(n), y(n);
        kernels::add_rmsnorm_forward<double>(h.data(), x.data(), ws.data(), s.data(), y.data(),
                                             rows, D, eps);
        return y;
      },
      [&](const std::vector<double>& ws, const std::vector<double>& dy) {
        std::vector<double> s(n), y(n), dx(n), dw(D), zero(n, 0.0);
        kernels::add_rmsnorm_forward<double>(h.data(), x.data(), ws.data(), s.data(), y.data(),
                                             rows, D, eps);
        kernels::rmsnorm_backward_add<double>(s.data(), ws.data(), dy.data(), zero.data(),
                                              dx.data(), dw.data(), rows, D, eps);
        return dw;
      },
      "add_rmsnorm dw");
}

TEST(KernelsRmsnormFused, DwIsIndependentOfThreadCountAndDxMayAliasDres) {
  const int64_t rows = 513, D = 96, n = rows * D;
  const auto x = random_vec<float>(n, 31, -2.0, 2.0);
  const auto w = random_vec<float>(D, 32, 0.5, 1.5);
  const auto dy = random_vec<float>(n, 33, -1.0, 1.0);
  const auto dres = random_vec<float>(n, 34, -1.0, 1.0);
  std::vector<float> dx1(n), dw1(D), dx4(n), dw4(D);
  with_threads(1, [&] {
    kernels::rmsnorm_backward_add<float>(x.data(), w.data(), dy.data(), dres.data(), dx1.data(),
                                         dw1.data(), rows, D, 1e-5);
  });
  with_threads(4, [&] {
    kernels::rmsnorm_backward_add<float>(x.data(), w.data(), dy.data(), dres.data(), dx4.data(),
                                         dw4.data(), rows, D, 1e-5);
  });
  EXPECT_TRUE(bitwise_equal(dw1, dw4));
  EXPECT_TRUE(bitwise_equal(dx1, dx4));
  // In place: the residual gradient buffer receives dx + dres.
  std::vector<float> inplace = dres, dw(D);
  kernels::rmsnorm_backward_add<float>(x.data(), w.data(), dy.data(), inplace.data(),
                                       inplace.data(), dw.data(), rows, D, 1e-5);
  EXPECT_TRUE(bitwise_equal(inplace, dx4));
  // dw == nullptr: only dx.
  std::vector<float> dx_only(n);
  kernels::rmsnorm_backward_add<float>(x.data(), w.data(), dy.data(), dres.data(), dx_only.data(),
                                       nullptr, rows, D, 1e-5);
  EXPECT_TRUE(bitwise_equal(dx_only, dx4));
}

TEST(KernelsRmsnormFused, BadSizesThrow) {
  std::vector<double> a(4, 1.0);
  EXPECT_THROW(kernels::add_rmsnorm_forward<double>(a.data(), a.data(), a.data(), a.data(),
                                                    a.data(), 1, 0, 1e-5),
               Error);
  EXPECT_THROW(kernels::rmsnorm_backward_add<double>(a.data(), a.data(), a.data(), a.data(),
                                                     a.data(), nullptr, 1, 4, -1.0),
               Error);
}

TEST(KernelsSwiglu, OutputsMayShareAnInputBuffer) {
  const int64_t n = 40000;  // parallel path
  const auto g = random_vec<float>(n, 41, -8.0, 8.0);
  const auto u = random_vec<float>(n, 42, -2.0, 2.0);
  const auto dy = random_vec<float>(n, 43, -1.0, 1.0);
  std::vector<float> p(n), dg(n), du(n);
  kernels::swiglu<float>(g.data(), u.data(), p.data(), n);
  kernels::swiglu_backward<float>(g.data(), u.data(), dy.data(), dg.data(), du.data(), n);
  std::vector<float> gp = g;  // out = g's buffer
  kernels::swiglu<float>(gp.data(), u.data(), gp.data(), n);
  EXPECT_TRUE(bitwise_equal(gp, p));
  std::vector<float> dyb = dy, ub = u;  // dg into dy's buffer, du into u's
  kernels::swiglu_backward<float>(g.data(), ub.data(), dyb.data(), dyb.data(), ub.data(), n);
  EXPECT_TRUE(bitwise_equal(dyb, dg));
  EXPECT_TRUE(bitwise_equal(ub, du));
}

TEST(KernelsRmsnormFused, SumMayShareTheResidualBuffer) {
  const int64_t rows = 300, D = 130, n = rows * D;
  const auto h = random_vec<float>(n, 51, -2.0, 2.0);
  const auto x = random_vec<float>(n, 52, -2.0, 2.0);
  const auto w = random_vec<float>(D, 53, 0.5, 1.5);
  std::vector<float> s(n), y(n), y2(n);
  kernels::add_rmsnorm_forward<float>(h.data(), x.data(), w.data(), s.data(), y.data(), rows, D,
                                      1e-5);
  std::vector<float> hs = h;
  kernels::add_rmsnorm_forward<float>(hs.data(), x.data(), w.data(), hs.data(), y2.data(), rows, D,
                                      1e-5);
  EXPECT_TRUE(bitwise_equal(hs, s));
  EXPECT_TRUE(bitwise_equal(y2, y));
}
