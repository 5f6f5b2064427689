// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Which libraries run the matrix products on this machine, and with which
// kernels: the figures MFU rests on. OpenBLAS picks its kernels by CPU model
// at start-up, and a release older than the CPU falls back to an old generic
// kernel (Debian 12's 0.3.21 runs Prescott's SSE3 code on some AVX-512 Xeons,
// 4-5x slower) without a word; this says so, with the fix.
#include <KokkosKernels_config.h>

#include <string>
#include <vector>

#include "core/types.hpp"

// fp32 host products cut in panels over Kokkos' threads (gemm.cpp): where
// Kokkos runs host threads of its own (OpenMP or Threads backend, no GPU)
// and Kokkos Kernels links a Fortran BLAS. With the Serial backend BLAS
// keeps its own threads (OPENBLAS_NUM_THREADS).
#if (defined(KOKKOS_ENABLE_OPENMP) || defined(KOKKOS_ENABLE_THREADS)) && !defined(KOKKOS_ENABLE_CUDA) &&     \
    !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL) && defined(KOKKOSKERNELS_ENABLE_TPL_BLAS) && \
    defined(F77_BLAS_MANGLE)
#define NDMINI_HOST_PANELS 1
#endif

namespace ndmini::kernels {

// The instruction-set extensions of this CPU that decide the GEMM kernels
// (from /proc/cpuinfo; all false where it cannot be read).
struct CpuFeatures {
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
};
CpuFeatures cpu_features();

// One line, e.g. "gemm: OpenBLAS 0.3.21 kernel Cooperlake, 1 thread | oneDNN
// 2.6.3, ISA avx512_core_bf16 | " and the route, describe_gemm_route() (cuBLAS
// in a CUDA build); with panels, "OpenBLAS 0.3.21 kernel Cooperlake, 1 thread, fp32 in
// panels on 2 OpenMP threads | ...". The BLAS part names the library only when it
// is OpenBLAS (others expose no kernel name).
std::string describe_gemm_libraries();

// The warning, with the fix, when OpenBLAS runs a kernel below what the CPU
// can do (no AVX2 kernel on an AVX2 CPU, no AVX-512 kernel on an AVX-512
// CPU); empty when all is well or the BLAS is not OpenBLAS. Pure function of
// its inputs, so it is testable for any CPU.
std::string blas_kernel_warning(const std::string& openblas_core, const CpuFeatures& cpu);

// OpenBLAS's kernel name on this machine (openblas_get_corename()); empty
// when the BLAS linked is not OpenBLAS.
std::string openblas_core();

// The products on the rank's own host threads (Kokkos' host concurrency: 1
// in a Serial build), not every core of the node: oneDNN on one thread (its
// own split over threads changes a product's bits with the thread count),
// and, where fp32 products run in panels on Kokkos' threads, BLAS on one
// thread per panel (else N Kokkos threads would each start N BLAS threads).
// Idempotent, called before the first product and by
// describe_gemm_libraries().
void use_rank_threads();

// Whether a host product of `precision` runs on the calling thread alone
// (OpenBLAS on 1 thread for fp32, oneDNN on 1 for bf16; never in a GPU
// build): then that thread's CPU time is the product's time, whatever else
// shares the core.
bool host_products_on_one_thread(bool bf16);
// ---- the route: which library runs which class of products ----------------
// The libraries a product can run on, and the two classes of the model's
// products a route is chosen for: the Linear layers' single products
// (gemm(), gemm_bf16()) and the attention heads' batched ones
// (gemm_strided_batched(), gemm_bf16_strided_batched()).
enum class GemmLibrary { blas, onednn, cublas };
enum class GemmClass { linear, heads };
inline constexpr GemmClass kGemmClasses[] = {GemmClass::linear, GemmClass::heads};
const char* name_of(GemmLibrary library);  // "BLAS", "oneDNN", "cuBLAS"
// Whether bf16 products are emulated here: widened to fp32 (into a buffer of
// their own, as large as the operands) and run through the fp32 route.
bool bf16_products_emulated();
// The floats an emulated bf16 product of a Linear layer with `rows` rows,
// `in` inputs and `out` outputs widens at once, the largest of its forward
// and its two backward products (operands only: C is fp32 in all three).
std::size_t emulated_linear_floats(std::size_t rows, std::size_t in, std::size_t out);
// Frees the buffer the emulated products widen into (the model's end; the next
// emulated product allocates it again).
void release_emulated_bf16();
const char* name_of(GemmClass cls);  // "linear", "heads"

// The libraries this build can run products of a precision on, the default
// first (the one a run takes when nothing is timed): a CUDA build cuBLAS;
// on the host fp32 BLAS, then oneDNN where the build has it; bf16 oneDNN
// (or, without it, BLAS on operands widened to fp32).
std::vector<GemmLibrary> gemm_libraries(bool bf16);

// Sends the host's fp32 products of `cls` to `library` (one of
// gemm_libraries(false)) until set again; bf16 has one library per build.
// set_host_gemm_route (kernels.hpp), when not by_shape, overrides it.
void set_gemm_library(GemmClass cls, GemmLibrary library);
GemmLibrary gemm_library(GemmClass cls, bool bf16);

// What chose the route, for the banner: the rate of every library timed, per
// precision and class (GFLOP/s; 0: not timed), and how the route was set.
struct GemmRouteReport {
  std::string how;                    // "chosen by timing ...", "perf.gemm_route = blas", ...
  double rate[2][2][3] = {};          // [bf16][class][library]: the class's products together
  double best_product[2][2][3] = {};  // the fastest single product of the same timing
  GemmLibrary library[2][2] = {{GemmLibrary::blas, GemmLibrary::blas},
                               {GemmLibrary::blas, GemmLibrary::blas}};  // chosen, [bf16][class]
  bool run_bf16 = false;  // the run's products are bf16 (the note below is for such runs)
};
void set_gemm_route_report(const GemmRouteReport& report);
// "fp32: linear BLAS (BLAS 95.1, oneDNN 88.0 GFLOP/s), heads oneDNN (...) |
// bf16: ..., chosen by timing ..." (how it was set); before any route was
// reported, the default route.
std::string describe_gemm_route();
// The note when bf16 does not pay: in a bf16 run whose calibrated bf16 rate
// (on the route it takes) is below the fp32 rate of the fp32 route chosen;
// "" otherwise. Pure function of the report, so it is testable for any CPU.
std::string bf16_slower_note(const GemmRouteReport& report);
// Whether the route sends any class of either precision to BLAS: where it
// sends none, an old OpenBLAS kernel slows no product of the run and its
// warning is left out.
bool route_uses_blas(const GemmRouteReport& report);

// What a run's banner and `ndmini check` print: describe_gemm_libraries(),
// then the warning if there is one ("warning: ...") and the bf16 note
// ("note: ..."), each line ending in '\n'.
std::string gemm_machine_lines();

}  // namespace ndmini::kernels
