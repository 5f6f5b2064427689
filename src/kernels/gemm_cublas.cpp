// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/gemm_cublas.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace ndmini::kernels::cublas {
namespace {

cublasHandle_t g_handle = nullptr;
cudaStream_t g_stream = nullptr;  // the stream g_handle is bound to

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string(call) + " failed: " + status_name(s));
}

cublasOperation_t op_of(char t) {
  if (t == 'N' || t == 'n') return CUBLAS_OP_N;
  if (t == 'T' || t == 't') return CUBLAS_OP_T;
  throw InternalError(std::string("gemm: transpose flag '") + t + "' is neither N nor T");
}

cublasHandle_t handle_for(cudaStream_t stream) {
  if (g_handle == nullptr) {
    check(cublasCreate(&g_handle), "cublasCreate");
    // Pure fp32 products (no TF32 down-conversion): the GPU run must match
    // the CPU run in fp32.
    check(cublasSetMathMode(g_handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    g_stream = nullptr;
    check(cublasSetStream(g_handle, g_stream), "cublasSetStream");
  }
  if (stream != g_stream) {
    check(cublasSetStream(g_handle, stream), "cublasSetStream");
    g_stream = stream;
  }
  return g_handle;
}

cudaDataType_t cuda_type(Type t) { return t == Type::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

void gemm(CUstream_st* stream, char transa, char transb, int m, int n, int k, float alpha, Operand a, Operand b,
          float beta, float* c, int ldc, long long stride_c, int count) {
  gemm(stream, transa, transb, m, n, k, alpha, Type::f32, a, b, beta, Type::f32, c, ldc, stride_c, count);
}

void gemm(CUstream_st* stream, char transa, char transb, int m, int n, int k, float alpha, Type ab, Operand a,
          Operand b, float beta, Type c_type, void* c, int ldc, long long stride_c, int count) {
  if (m <= 0 || n <= 0 || count <= 0) return;
  cublasHandle_t h = handle_for(stream);
  // Row-major C [m, n] is column-major C^T [n, m]: C^T = op(B)^T op(A)^T. A
  // row-major operand read column-major is its transpose, so each operand
  // keeps its own flag, B goes first, and m and n swap. Leading dimensions
  // are the row strides (at least 1 for cuBLAS, even when k = 0).
  const cublasOperation_t ta = op_of(transa), tb = op_of(transb);
  const int lda = std::max(a.ld, 1), ldb = std::max(b.ld, 1), ldcc = std::max(ldc, 1);
  const cudaDataType_t in = cuda_type(ab), out = cuda_type(c_type);
  if (count == 1) {
    check(cublasGemmEx(h, tb, ta, n, m, k, &alpha, b.data, in, ldb, a.data, in, lda, &beta, c, out, ldcc,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  } else {
    check(cublasGemmStridedBatchedEx(h, tb, ta, n, m, k, &alpha, b.data, in, ldb, b.stride, a.data, in, lda, a.stride,
                                     &beta, c, out, ldcc, stride_c, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  }
}

void release_handle() {
  if (g_handle != nullptr) cublasDestroy(g_handle);  // nothing useful to do on failure at teardown
  g_handle = nullptr;
  g_stream = nullptr;
}

bool device_available() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

}  // namespace ndmini::kernels::cublas
