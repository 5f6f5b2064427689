// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Matrix products on the CPU through oneDNN's matmul primitive, for ndmini's
// GEMM wrapper (kernels/kernels.hpp) in a build with oneDNN
// (NDMINI_HAVE_ONEDNN). Like the cuBLAS layer it knows neither Kokkos nor
// ndmini's views, only host pointers.
//
// Operands are ROW-major as ndmini stores every matrix; op = 'T' is read
// through swapped strides (no copy). Inputs are fp32 or bf16 (both operands
// the same), accumulation is fp32 (oneDNN's matmul accumulates bf16 products
// in fp32), C is fp32 or bf16. Where the CPU has AMX or AVX512-BF16, oneDNN
// dispatches bf16 products to them itself.
//
// Primitives: one per distinct problem (shape, strides, types, alpha, beta,
// batch), created on first use and kept for the process (oneDNN's JIT code
// generation costs milliseconds; a training step repeats the same few shapes).
//
// Threads: oneDNN's own runtime (OpenMP in Debian's and Spack's builds)
// would take every core of the node (OMP_NUM_THREADS unset), so several ranks
// on a node oversubscribe it; use_threads() gives it the rank's threads.
#include <string>

namespace ndmini::kernels::onednn {

enum class Type { f32, bf16 };

// One operand of a batch: matrix i starts `stride` elements after matrix i - 1.
struct Operand {
  const void* data = nullptr;
  int ld = 0;            // elements between consecutive rows (row-major)
  long long stride = 0;  // elements between consecutive matrices of a batch
};

struct Output {
  void* data = nullptr;
  int ld = 0;
  long long stride = 0;
};

// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, op = 'N' or 'T';
// C_i is row-major [m, n], k the inner size; A and B of type `in`, C of type
// `out`. Synchronous. Returns oneDNN's name of the implementation it ran (e.g.
// "brg:avx512_core_bf16"; valid until the next call). Throws ndmini::Error when oneDNN has no
// implementation for the problem on this CPU (bf16 needs at least AVX-512).
const std::string& gemm(char transa, char transb, int m, int n, int k, float alpha, Type in, Operand a, Operand b,
                        float beta, Type out, Output c, int count);

// Whether oneDNN has a bf16 matrix product on this CPU (it needs AVX-512 at
// least; an AVX2 machine has none): one 16 x 16 product tried once per process.
bool has_bf16();

// oneDNN's version, the instruction set it dispatches to on this CPU and,
// with its OpenMP runtime, its threads: "oneDNN 2.6.3, ISA avx512_core_bf16,
// 1 thread (OpenMP)".
std::string describe();

// The threads every later product uses (the rank's host threads; the caller
// knows them): with the OpenMP runtime, omp_set_num_threads before each
// product, whichever host thread issues it. No effect with other runtimes.
void use_threads(int threads);

}  // namespace ndmini::kernels::onednn
