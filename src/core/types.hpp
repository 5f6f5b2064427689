// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The data model in one place: the execution and memory spaces every kernel
// runs in, and the View aliases used for parameters, activations and tokens.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/bf16.hpp"

namespace ndmini {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;

// True when MemSpace is a GPU's memory the host cannot read (a CUDA build):
// kernels then pick their coalesced device variants, and the MPI backend
// needs a CUDA-aware MPI or a copy through host memory.
inline constexpr bool kDeviceMemory = !Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;

// Master weights, gradients, optimizer state and activations are fp32; with
// train.precision = "bf16" the matrix products' operands (a working copy of
// the weights, the activations kept as their inputs) are bf16.
using real = float;

// Row-major everywhere: a [rows, cols] matrix is contiguous along cols, like
// PyTorch, so a Linear weight [out, in] is stored exactly as in GPT-2 files.
using View1D = Kokkos::View<real*, Kokkos::LayoutRight, MemSpace>;
using View2D = Kokkos::View<real**, Kokkos::LayoutRight, MemSpace>;
using View4D = Kokkos::View<real****, Kokkos::LayoutRight, MemSpace>;

// Views into memory owned elsewhere (a slice of the flat parameter buffer, a
// head of the attention tensors): no reference counting, no allocation.
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
using Slice1D = Kokkos::View<real*, Kokkos::LayoutRight, MemSpace, Unmanaged>;
using Slice2D = Kokkos::View<real**, Kokkos::LayoutRight, MemSpace, Unmanaged>;
using ConstSlice1D = Kokkos::View<const real*, Kokkos::LayoutRight, MemSpace, Unmanaged>;
using ConstSlice2D = Kokkos::View<const real**, Kokkos::LayoutRight, MemSpace, Unmanaged>;

// bf16 operands of mixed-precision matrix products (core/bf16.hpp).
using Bf16View1D = Kokkos::View<bf16*, Kokkos::LayoutRight, MemSpace>;
using Bf16Slice1D = Kokkos::View<bf16*, Kokkos::LayoutRight, MemSpace, Unmanaged>;
using ConstBf16Slice1D = Kokkos::View<const bf16*, Kokkos::LayoutRight, MemSpace, Unmanaged>;
using Bf16Slice2D = Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace, Unmanaged>;
using ConstBf16Slice2D = Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace, Unmanaged>;

// The same shapes over an element type T: real, or bf16 where mixed
// precision keeps an operand in bf16. Code written once for both precisions
// takes its operands as these (Matrix<real> is Slice2D).
template <class T>
using Buffer = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
template <class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace, Unmanaged>;
template <class T>
using ConstMatrix = Kokkos::View<const T**, Kokkos::LayoutRight, MemSpace, Unmanaged>;
// A parameter whose type the caller names (f<bf16>(...)) rather than one
// deduced from the argument: a Slice2D then converts to a ConstMatrix<real>.
template <class T>
struct Named {
  using type = T;
};
template <class T>
using named_t = typename Named<T>::type;

// Token ids. int32 covers every vocabulary GPT-2 style models use.
using token_t = std::int32_t;
using TokenView = Kokkos::View<token_t*, Kokkos::LayoutRight, MemSpace>;
using ConstTokenView = Kokkos::View<const token_t*, Kokkos::LayoutRight, MemSpace>;
using HostTokenView = Kokkos::View<token_t*, Kokkos::LayoutRight, HostSpace>;

using HostView1D = Kokkos::View<real*, Kokkos::LayoutRight, HostSpace>;

// A buffer its user writes before reading: no zero fill.
inline View1D uninitialized(const std::string& label, std::size_t n) {
  return View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
}
inline Bf16View1D uninitialized_bf16(const std::string& label, std::size_t n) {
  return Bf16View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
}

// A flat buffer seen as a row-major [rows, cols] matrix.
template <class T>
Matrix<T> as_matrix(const Buffer<T>& v, std::size_t rows, std::size_t cols) {
  return Matrix<T>(v.data(), rows, cols);
}

// An activation kept for the backward that a matrix product reads (or the
// GELU's input): fp32, or bf16 under mixed precision. One of the two views
// is allocated, the other stays empty.
struct KeptOperand {
  View1D fp32;
  Bf16View1D bf16;
  // The kept values as [rows, cols] of element type T (real or bf16).
  template <class T>
  Matrix<T> as(std::size_t rows, std::size_t cols) const {
    if constexpr (std::is_same_v<T, ndmini::bf16>)
      return as_matrix(bf16, rows, cols);
    else
      return as_matrix(fp32, rows, cols);
  }
};

}  // namespace ndmini
