// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Helpers shared by the numerical tests: deterministic inputs, host copies,
// norm-relative errors, central finite differences and the bounds they are
// held to.
//
// Objective for gradient checks: L = sum(out .* R) for a fixed random R,
// evaluated in double, so the analytic gradient is the backward with
// dout = R. Float32 forward passes make FD noisy at ~1e-7 relative, hence
// h = 1e-2 and a norm-based relative error ||fd - an|| / ||fd||.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/rng.hpp"
#include "core/types.hpp"

namespace ndmini::test {

constexpr double kStep = 1e-2;    // FD step for float32 forwards
constexpr double kFdTol = 1e-3;   // norm-relative error bound for FD gradients
constexpr double kFwdTol = 1e-5;  // norm-relative error bound for forwards vs double references

// ---- host <-> device helpers (correct on a GPU build too) --------------------

// Uniform values in [lo, hi) from the project's counter RNG: the same numbers
// on every platform and compiler.
template <class V>
inline void fill_uniform(const V& v, std::uint64_t seed, double lo, double hi) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double u = static_cast<double>(rng::bits(seed, i) >> 40) / 16777216.0;
    h.data()[i] = static_cast<real>(lo + (hi - lo) * u);
  }
  Kokkos::deep_copy(v, h);
}

template <class V>
inline std::vector<double> host(const V& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<double>(h.data(), h.data() + v.size());
}

template <class V>
inline void upload(const V& v, const std::vector<double>& values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < v.size(); ++i) h.data()[i] = static_cast<real>(values[i]);
  Kokkos::deep_copy(v, h);
}

inline TokenView tokens_from(const std::vector<int>& t) {
  TokenView v("tokens", t.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < t.size(); ++i) h(i) = t[i];
  Kokkos::deep_copy(v, h);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ||ref - got|| / ||ref||
inline double rel_err(const std::vector<double>& ref, const std::vector<double>& got) {
  EXPECT_EQ(ref.size(), got.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (ref[i] - got[i]) * (ref[i] - got[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Every index for small tensors, else a deterministic sample of `count`.
inline std::vector<std::size_t> indices(std::size_t n, std::size_t count = 64) {
  std::vector<std::size_t> idx;
  if (n <= count) {
    for (std::size_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    for (std::size_t k = 0; k < count; ++k) idx.push_back(k * n / count + rng::bits(99, k) % (n / count));
  }
  return idx;
}

inline std::vector<double> pick(const std::vector<double>& v, const std::vector<std::size_t>& idx) {
  std::vector<double> out;
  for (auto i : idx) out.push_back(v[i]);
  return out;
}

// Central differences of objective() w.r.t. the listed flat elements of x,
// dividing by the step actually taken after rounding to float.
template <class V, class F>
inline std::vector<double> central_diff(const V& x, const std::vector<std::size_t>& idx, F objective,
                                        double h = kStep) {
  auto hx = Kokkos::create_mirror_view(x);
  Kokkos::deep_copy(hx, x);
  std::vector<double> g;
  for (auto i : idx) {
    const real orig = hx.data()[i];
    const real up = orig + static_cast<real>(h), dn = orig - static_cast<real>(h);
    hx.data()[i] = up;
    Kokkos::deep_copy(x, hx);
    const double lp = objective();
    hx.data()[i] = dn;
    Kokkos::deep_copy(x, hx);
    const double lm = objective();
    hx.data()[i] = orig;
    Kokkos::deep_copy(x, hx);
    g.push_back((lp - lm) / (static_cast<double>(up) - static_cast<double>(dn)));
  }
  return g;
}

// Compares FD and analytic gradients and prints the error (to size the bounds).
inline void expect_grad(const char* what, const std::vector<double>& fd, const std::vector<double>& an,
                        double tol = kFdTol) {
  const double e = rel_err(fd, an);
  std::printf("  [fd] %-28s rel err %.3e (bound %.0e, %zu elems)\n", what, e, tol, fd.size());
  EXPECT_LT(e, tol) << what;
}

inline void expect_close(const char* what, const std::vector<double>& ref, const std::vector<double>& got,
                         double tol = kFwdTol) {
  const double e = rel_err(ref, got);
  std::printf("  [ref] %-27s rel err %.3e (bound %.0e)\n", what, e, tol);
  EXPECT_LT(e, tol) << what;
}

}  // namespace ndmini::test
