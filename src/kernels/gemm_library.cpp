// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/gemm_library.hpp"

#include <cstdio>
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
    // One thread: oneDNN's own split of a product over threads reorders its
    // sums (with AMX a 1536x384x1024 TN bf16 product differed between 1 and
    // 2 threads), and a rank's results must not depend on its thread count.
    onednn::use_threads(1);
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
    if (onednn::has_bf16()) {
      use_rank_threads();
      return true;  // oneDNN on one thread
    }
#endif
    return false;  // emulated through the fp32 route, with a widening pass on Kokkos' threads
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
  s += " | " + onednn::describe();
  if (!onednn::has_bf16()) s += " (no bf16 products on this CPU: bf16 emulated through the fp32 route)";
#else
  s += " | no oneDNN: bf16 emulated through fp32 BLAS";
#endif
#endif
  return s + " | " + describe_gemm_route();
}

namespace {

GemmLibrary g_fp32_library[2] = {GemmLibrary::blas, GemmLibrary::blas};  // [class]
GemmRouteReport g_report;
bool g_reported = false;

std::string rate_text(double flops) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", flops / 1e9);
  return buf;
}

// "linear BLAS (BLAS 95.1, oneDNN 88.0 GFLOP/s)": the library that runs the
// class and the rates that chose it; one library timed: "linear oneDNN 190.2 GFLOP/s".
std::string class_text(const GemmRouteReport& r, bool bf16, GemmClass cls) {
  const std::vector<GemmLibrary> libs = gemm_libraries(bf16);
  std::string s = std::string(name_of(cls)) + " " + name_of(r.library[bf16][static_cast<int>(cls)]);
  const double* rate = r.rate[bf16][static_cast<int>(cls)];
  std::string rates;
  for (GemmLibrary l : libs) {
    if (rate[static_cast<int>(l)] <= 0) continue;
    if (!rates.empty()) rates += ", ";
    rates += (libs.size() > 1 ? std::string(name_of(l)) + " " : "") + rate_text(rate[static_cast<int>(l)]);
  }
  if (rates.empty()) return s;
  return libs.size() > 1 ? s + " (" + rates + " GFLOP/s)" : s + " " + rates + " GFLOP/s";
}

}  // namespace

const char* name_of(GemmLibrary library) {
  return library == GemmLibrary::blas ? "BLAS" : library == GemmLibrary::onednn ? "oneDNN" : "cuBLAS";
}
const char* name_of(GemmClass cls) { return cls == GemmClass::linear ? "linear" : "heads"; }

std::vector<GemmLibrary> gemm_libraries(bool bf16) {
  if constexpr (kDeviceMemory) return {GemmLibrary::cublas};
#ifdef NDMINI_HAVE_ONEDNN
  // Without oneDNN's bf16 products (an AVX2 CPU) bf16 is widened and run
  // through the fp32 route, BLAS by default: named "BLAS" here.
  if (bf16) return {onednn::has_bf16() ? GemmLibrary::onednn : GemmLibrary::blas};
  return {GemmLibrary::blas, GemmLibrary::onednn};
#else
  (void)bf16;
  return {GemmLibrary::blas};
#endif
}

bool bf16_products_emulated() { return gemm_libraries(true).front() == GemmLibrary::blas; }

std::size_t emulated_linear_floats(std::size_t rows, std::size_t in, std::size_t out) {
  // y = x W^T: x [rows, in], W [out, in]; dx = dy W: dy [rows, out]; dW = dy^T x.
  return std::max({rows * in + out * in, rows * out + out * in, rows * out + rows * in});
}

void set_gemm_library(GemmClass cls, GemmLibrary library) {
  const std::vector<GemmLibrary> libs = gemm_libraries(false);
  bool available = false;
  for (GemmLibrary l : libs) available |= l == library;
  g_fp32_library[static_cast<int>(cls)] = available ? library : libs.front();
}

GemmLibrary gemm_library(GemmClass cls, bool bf16) {
  return bf16 ? gemm_libraries(true).front() : g_fp32_library[static_cast<int>(cls)];
}

void set_gemm_route_report(const GemmRouteReport& report) {
  g_report = report;
  g_reported = true;
}

std::string describe_gemm_route() {
  if (!g_reported) {
    if constexpr (kDeviceMemory) return "fp32 and bf16 through cuBLAS";
    return std::string("fp32 through ") + name_of(gemm_library(GemmClass::linear, false)) + ", bf16 through " +
           name_of(gemm_library(GemmClass::linear, true)) +
           " (the default route; a run without perf.peak_gflops "
           "times the libraries, perf.gemm_route forces one)";
  }
  std::string s;
  for (bool bf16 : {false, true}) {
    const double* linear = g_report.rate[bf16][0];
    const double* heads = g_report.rate[bf16][1];
    bool timed = false;
    for (int l = 0; l < 3; ++l) timed |= linear[l] > 0 || heads[l] > 0;
    if (bf16 && !timed && !g_report.run_bf16) continue;  // an fp32 run does not time bf16
    if (!s.empty()) s += " | ";
    s += std::string(bf16 ? "bf16: " : "fp32: ") + class_text(g_report, bf16, GemmClass::linear) + ", " +
         class_text(g_report, bf16, GemmClass::heads);
  }
  return s + " (" + g_report.how + ")";
}

std::string bf16_slower_note(const GemmRouteReport& r) {
  if (!r.run_bf16) return "";
  // The class of most of a step's FLOPs decides: the Linear layers.
  const int linear = static_cast<int>(GemmClass::linear);
  const double bf16 = r.rate[1][linear][static_cast<int>(r.library[1][linear])];
  const double fp32 = r.rate[0][linear][static_cast<int>(r.library[0][linear])];
  if (bf16 <= 0 || fp32 <= 0 || bf16 >= fp32) return "";
  return "bf16 products run at " + rate_text(bf16) + " GFLOP/s here, below fp32's " + rate_text(fp32) +
         " GFLOP/s (the Linear layers' products, as the calibration timed them): bf16 still halves the memory "
         "of activations and the bytes on the wire, but not the step time; train.precision = \"fp32\" may be "
         "faster on this machine";
}

bool route_uses_blas(const GemmRouteReport& r) {
  for (const auto& precision : r.library)
    for (GemmLibrary library : precision)
      if (library == GemmLibrary::blas) return true;
  return false;
}

std::string gemm_machine_lines() {
  std::string s = describe_gemm_libraries() + "\n";
  // Before a route is chosen (ndmini check), the default route: BLAS.
  const std::string warning =
      !g_reported || route_uses_blas(g_report) ? blas_kernel_warning(openblas_core(), cpu_features()) : "";
  if (!warning.empty()) s += "warning: " + warning + "\n";
  if (g_reported) {
    const std::string note = bf16_slower_note(g_report);
    if (!note.empty()) s += "note: " + note + "\n";
  }
  return s;
}

}  // namespace ndmini::kernels
