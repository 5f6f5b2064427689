// SPDX-License-Identifier: BSD-3-Clause
// Moving token rows for the Mixture-of-Experts dispatch and combine
// (layers/expert_parallel.hpp), with the conventions of kernels.cpp: one
// thread per row, deterministic, no atomics (each output row has one writer,
// and a row's k slots are summed in slot order).
#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini::kernels {
namespace {

using Range = Kokkos::RangePolicy<ExecSpace>;

template <class To, class From>
KOKKOS_INLINE_FUNCTION To convert(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_same_v<To, bf16>)
    return bf16(v);
  else
    return static_cast<To>(v);
}

template <class A, class B>
void require_columns(const char* what, const A& a, const B& b) {
  if (a.extent(1) != b.extent(1))
    throw InternalError(std::string(what) + ": rows of " + std::to_string(a.extent(1)) + " and " +
                        std::to_string(b.extent(1)) + " columns");
}

}  // namespace

template <class Dst, class Src>
void gather_rows(Matrix<Dst> dst, ConstMatrix<Src> src, IndexView index) {
  require_columns("gather_rows", dst, src);
  if (index.extent(0) < dst.extent(0)) throw InternalError("gather_rows: fewer indices than rows");
  const int C = dst.extent(1);
  Kokkos::parallel_for(
      "ndmini::moe_gather_rows", Range(0, dst.extent(0)), KOKKOS_LAMBDA(const int i) {
        const Src* s = &src(index(i), 0);
        Dst* d = &dst(i, 0);
        for (int c = 0; c < C; ++c) d[c] = convert<Dst>(s[c]);
      });
}

template <class T>
void combine_rows(Slice2D out, ConstMatrix<T> rows, ConstSlice1D weight, IndexView position, int k) {
  require_columns("combine_rows", out, rows);
  const int C = out.extent(1);
  Kokkos::parallel_for(
      "ndmini::moe_combine", Range(0, out.extent(0)), KOKKOS_LAMBDA(const int r) {
        real* o = &out(r, 0);
        for (int j = 0; j < k; ++j) {
          const real w = weight(r * k + j);
          const T* y = &rows(position(r * k + j), 0);
          for (int c = 0; c < C; ++c) o[c] += w * convert<real>(y[c]);
        }
      });
}

template <class T>
void slot_dots(Slice1D dweight, ConstSlice2D dout, ConstMatrix<T> rows, IndexView position, int k) {
  require_columns("slot_dots", dout, rows);
  const int C = dout.extent(1);
  Kokkos::parallel_for(
      "ndmini::moe_slot_dots", Range(0, dout.extent(0) * k), KOKKOS_LAMBDA(const int s) {
        const real* g = &dout(s / k, 0);
        const T* y = &rows(position(s), 0);
        real sum = 0;
        for (int c = 0; c < C; ++c) sum += g[c] * convert<real>(y[c]);
        dweight(s) = sum;
      });
}

template <class T>
void scatter_weighted(Matrix<T> dst, ConstSlice2D dout, ConstSlice1D weight, IndexView position, int k) {
  require_columns("scatter_weighted", dst, dout);
  const int C = dout.extent(1);
  Kokkos::parallel_for(
      "ndmini::moe_scatter_weighted", Range(0, dout.extent(0) * k), KOKKOS_LAMBDA(const int s) {
        const real w = weight(s);
        const real* g = &dout(s / k, 0);
        T* d = &dst(position(s), 0);
        for (int c = 0; c < C; ++c) d[c] = convert<T>(w * g[c]);
      });
}

template <class T>
void sum_slots(Slice2D dx, ConstMatrix<T> rows, IndexView position, int k) {
  require_columns("sum_slots", dx, rows);
  const int C = dx.extent(1);
  Kokkos::parallel_for(
      "ndmini::moe_sum_slots", Range(0, dx.extent(0)), KOKKOS_LAMBDA(const int r) {
        real* d = &dx(r, 0);
        for (int j = 0; j < k; ++j) {
          const T* y = &rows(position(r * k + j), 0);
          for (int c = 0; c < C; ++c) d[c] += convert<real>(y[c]);
        }
      });
}

template void gather_rows<real, real>(Matrix<real>, ConstMatrix<real>, IndexView);
template void gather_rows<bf16, bf16>(Matrix<bf16>, ConstMatrix<bf16>, IndexView);
template void gather_rows<bf16, real>(Matrix<bf16>, ConstMatrix<real>, IndexView);
template void gather_rows<real, bf16>(Matrix<real>, ConstMatrix<bf16>, IndexView);
template void combine_rows<real>(Slice2D, ConstMatrix<real>, ConstSlice1D, IndexView, int);
template void combine_rows<bf16>(Slice2D, ConstMatrix<bf16>, ConstSlice1D, IndexView, int);
template void slot_dots<real>(Slice1D, ConstSlice2D, ConstMatrix<real>, IndexView, int);
template void slot_dots<bf16>(Slice1D, ConstSlice2D, ConstMatrix<bf16>, IndexView, int);
template void scatter_weighted<real>(Matrix<real>, ConstSlice2D, ConstSlice1D, IndexView, int);
template void scatter_weighted<bf16>(Matrix<bf16>, ConstSlice2D, ConstSlice1D, IndexView, int);
template void sum_slots<real>(Slice2D, ConstMatrix<real>, IndexView, int);
template void sum_slots<bf16>(Slice2D, ConstMatrix<bf16>, IndexView, int);

}  // namespace ndmini::kernels
