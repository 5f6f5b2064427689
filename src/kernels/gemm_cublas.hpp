// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Matrix products on an NVIDIA GPU through cuBLAS, for ndmini's GEMM wrapper
// (kernels/kernels.hpp) in a CUDA build. This layer knows neither Kokkos nor
// ndmini's views, only device pointers and a CUDA stream, so it compiles with
// the host compiler wherever the CUDA toolkit is (CI builds and tests it
// without a Kokkos CUDA backend).
//
// Operands are ROW-major, as ndmini stores every matrix: a [rows, cols]
// matrix has its rows `ld` floats apart. cuBLAS is column-major, so the
// product C = op(A) op(B) is issued as C^T = op(B)^T op(A)^T, which reads the
// same memory with no copy.
//
// Precision: fp32 inputs and outputs with CUBLAS_COMPUTE_32F (no TF32), so a
// GPU run can be compared with the CPU run in fp32; under bf16 mixed
// precision bf16 inputs (CUDA_R_16BF), fp32 or bf16 outputs, fp32
// accumulation (CUBLAS_COMPUTE_32F), as oneDNN does on the CPU.
//
// Handle: one per process, created on first use on the current device and
// bound (cublasSetStream) to the stream of each call; release_handle()
// destroys it (the Kokkos side calls it from a Kokkos finalize hook).

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ndmini::kernels::cublas {

// One operand of a batch: matrix i starts `stride` elements after matrix i - 1.
struct Operand {
  const void* data = nullptr;  // fp32 or bf16 elements (see Type)
  int ld = 0;                  // elements between consecutive rows (row-major)
  long long stride = 0;        // elements between consecutive matrices of a batch
};

// Element types: fp32, or bf16 (16-bit storage, ndmini's core/bf16.hpp).
enum class Type { f32, bf16 };

// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, op = 'N' or 'T';
// C_i is row-major [m, n] with rows ldc floats apart, k is the inner size.
// count == 1 is one cublasGemmEx, count > 1 one cublasGemmStridedBatchedEx.
// Asynchronous on `stream`. Throws ndmini::Error when cuBLAS refuses the call.
void gemm(CUstream_st* stream, char transa, char transb, int m, int n, int k, float alpha, Operand a, Operand b,
          float beta, float* c, int ldc, long long stride_c, int count);
// The same with A and B of `ab` and C of `c_type` (fp32 accumulation).
void gemm(CUstream_st* stream, char transa, char transb, int m, int n, int k, float alpha, Type ab, Operand a,
          Operand b, float beta, Type c_type, void* c, int ldc, long long stride_c, int count);

// Destroys the handle (a later gemm makes a new one). Call before the CUDA
// context goes away.
void release_handle();

// Whether a CUDA device is visible to this process (for tests that skip).
bool device_available();

}  // namespace ndmini::kernels::cublas
