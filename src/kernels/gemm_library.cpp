// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/gemm_library.hpp"

#include <fstream>
#include <set>
#include <sstream>

#include "core/types.hpp"
#ifdef NDMINI_HAVE_ONEDNN
#include "kernels/gemm_onednn.hpp"
#endif

// OpenBLAS's introspection, declared weak: present when the BLAS Kokkos
// Kernels links is OpenBLAS (Debian's libblas.so.3 alternative, Spack's
// openblas), null otherwise (reference BLAS, MKL, ...).
extern "C" {
char* openblas_get_corename(void) __attribute__((weak));
char* openblas_get_config(void) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
void openblas_set_num_threads(int) __attribute__((weak));
}

namespace ndmini::kernels {

CpuFeatures cpu_features() {
  CpuFeatures f;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) {
      f.avx2 |= w == "avx2";
      f.avx512f |= w == "avx512f";
      f.avx512_bf16 |= w == "avx512_bf16";
      f.amx_bf16 |= w == "amx_bf16";
    }
    break;  // every core lists the same flags
  }
  return f;
}

std::string openblas_core() { return openblas_get_corename ? openblas_get_corename() : ""; }

std::string blas_kernel_warning(const std::string& core, const CpuFeatures& cpu) {
  if (core.empty() || !cpu.avx2) return "";
  // OpenBLAS's x86-64 kernels with AVX-512 GEMM code, and those with AVX2 code
  // (Zen, Skylake client and Excavator run the Haswell kernels).
  static const std::set<std::string> kAvx512 = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  static const std::set<std::string> kAvx2 = {"Haswell",  "Zen",        "Excavator",
                                              "SkylakeX", "Cooperlake", "SapphireRapids"};
  const bool below_avx512 = cpu.avx512f && kAvx512.count(core) == 0;
  const bool below_avx2 = kAvx2.count(core) == 0;
  if (!below_avx512 && !below_avx2) return "";
  // The kernel that matches: Cooper Lake's has the AVX512-BF16 extensions too.
  const char* fix = cpu.avx512_bf16 ? "Cooperlake" : cpu.avx512f ? "SkylakeX" : "Haswell";
  return "OpenBLAS runs its " + core + " kernel on a CPU with " + (cpu.avx512f ? "AVX-512" : "AVX2") +
         ": fp32 products, and the peak MFU is calibrated against, run well below this CPU's speed (an OpenBLAS "
         "older than the CPU model, or OPENBLAS_CORETYPE, picked that kernel). Fix: export OPENBLAS_CORETYPE=" +
         fix + " before the run (in the batch script, or srun --export=ALL,OPENBLAS_CORETYPE=" + fix + ")";
}

void use_rank_threads() {
  static const bool once = [] {
#ifdef NDMINI_HAVE_ONEDNN
    onednn::use_threads(Kokkos::DefaultHostExecutionSpace().concurrency());
#endif
#ifdef NDMINI_HOST_PANELS
    if (openblas_set_num_threads) openblas_set_num_threads(1);
#endif
    return true;
  }();
  (void)once;
}

bool host_products_on_one_thread(bool bf16) {
  if constexpr (kDeviceMemory) return false;
  if (bf16) {
#ifdef NDMINI_HAVE_ONEDNN
    use_rank_threads();
    return Kokkos::DefaultHostExecutionSpace().concurrency() == 1;
#else
    return false;  // emulated through the fp32 route, with a widening pass on Kokkos' threads
#endif
  }
#ifdef NDMINI_HOST_PANELS
  return Kokkos::DefaultHostExecutionSpace().concurrency() == 1;  // panels on Kokkos' threads
#else
  return openblas_get_num_threads != nullptr && openblas_get_num_threads() == 1;
#endif
}

std::string describe_gemm_libraries() {
  std::string s = "gemm: ";
#if defined(KOKKOS_ENABLE_CUDA) && defined(NDMINI_HAVE_CUBLAS)
  s += "cuBLAS (fp32 inputs, or bf16 under train.precision = bf16; CUBLAS_COMPUTE_32F)";
#else
  if (openblas_get_corename) {
    std::string version = openblas_get_config ? openblas_get_config() : "OpenBLAS";
    version = version.substr(0, version.find(' ', version.find(' ') + 1));  // "OpenBLAS 0.3.21"
    s += version + " kernel " + openblas_core();
    if (openblas_get_num_threads) {
      use_rank_threads();
      const int threads = openblas_get_num_threads();
      s += ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
    }
  } else {
    s += "BLAS (not OpenBLAS: no kernel name)";
  }
#ifdef NDMINI_HOST_PANELS
  const int panel_threads = Kokkos::DefaultHostExecutionSpace().concurrency();
  s += std::string(", fp32 in panels on ") + std::to_string(panel_threads) + " " +
       Kokkos::DefaultHostExecutionSpace::name() + (panel_threads == 1 ? " thread" : " threads");
#endif
#ifdef NDMINI_HAVE_ONEDNN
  use_rank_threads();
  s += " | " + onednn::describe() + " | fp32 through BLAS, bf16 through oneDNN";
#else
  s += " | no oneDNN: fp32 products through BLAS, bf16 emulated";
#endif
#endif
  return s;
}

std::string gemm_machine_lines() {
  std::string s = describe_gemm_libraries() + "\n";
  const std::string warning = blas_kernel_warning(openblas_core(), cpu_features());
  if (!warning.empty()) s += "warning: " + warning + "\n";
  return s;
}

}  // namespace ndmini::kernels
