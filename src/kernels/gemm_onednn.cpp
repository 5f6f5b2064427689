// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/gemm_onednn.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/error.hpp"

#if DNNL_VERSION_MAJOR != 2
#error "ndmini's oneDNN layer is written against the oneDNN 2.x API (output scales, matmul::desc)"
#endif

#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
// The OpenMP runtime oneDNN was built with (loaded with it): how many threads
// its products will use. Weak, so ndmini needs no OpenMP flags of its own.
extern "C" int omp_get_max_threads(void) __attribute__((weak));
extern "C" void omp_set_num_threads(int) __attribute__((weak));
#endif

namespace ndmini::kernels::onednn {
namespace {

using dnnl::memory;

memory::data_type dnnl_type(Type t) { return t == Type::bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

bool transposed(char t) { return t == 'T' || t == 't'; }

// The [rows, cols] = op(X) view of a row-major operand with leading dimension
// ld, as a (batched) oneDNN memory descriptor: 'T' swaps the strides, so no
// copy is made. A batch stride of 0 with several matrices broadcasts one.
memory::desc matrix(Type t, bool trans, int rows, int cols, int ld, long long stride, int count) {
  const memory::dim r = rows, c = cols, l = ld;
  const memory::dim row_stride = trans ? 1 : l, col_stride = trans ? l : 1;
  if (count == 1) return memory::desc({r, c}, dnnl_type(t), {row_stride, col_stride});
  const memory::dim batch = stride == 0 ? 1 : count;
  return memory::desc({batch, r, c}, dnnl_type(t), {static_cast<memory::dim>(stride), row_stride, col_stride});
}

// Everything a primitive is specialised for (oneDNN 2.x bakes alpha, as the
// output scale, and beta, as the sum post-op's scale, into the primitive;
// its blocking follows the thread count it was made under, the last).
using Key = std::tuple<char, char, int, int, int, float, Type, int, long long, int, long long, float, Type, int,
                       long long, int, int>;

struct Entry {
  dnnl::matmul primitive;
  memory::desc a, b, c;
  std::string implementation;
};

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;
  std::mutex mutex;  // the cache; a product may be issued from any host thread
};

Engine& cpu() {
  static Engine e;
  return e;
}

// A bound on the distinct products kept: attention's causal tiles bring a few
// shapes per sequence length; a long run with many lengths must not grow
// without limit.
constexpr std::size_t kMaxPrimitives = 512;

std::string type_name(Type t) { return t == Type::bf16 ? "bf16" : "f32"; }

std::atomic<int> g_threads{0};  // use_threads(); 0: oneDNN's runtime decides

// OpenMP's thread count is a per-thread setting: applied on the thread that
// issues the product, before the primitive is made (oneDNN sizes its
// blocking by it) and before it runs.
void apply_threads() {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  const int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0 && omp_set_num_threads) omp_set_num_threads(n);
#endif
}

}  // namespace

const std::string& gemm(char transa, char transb, int m, int n, int k, float alpha, Type in, Operand a, Operand b,
                        float beta, Type out, Output c, int count) {
  Engine& e = cpu();
  std::lock_guard<std::mutex> lock(e.mutex);
  apply_threads();
  const Key key{transa,
                transb,
                m,
                n,
                k,
                alpha,
                in,
                a.ld,
                a.stride,
                b.ld,
                b.stride,
                beta,
                out,
                c.ld,
                c.stride,
                count,
                g_threads.load(std::memory_order_relaxed)};
  auto it = e.cache.find(key);
  if (it == e.cache.end()) {
    if (e.cache.size() >= kMaxPrimitives) e.cache.clear();
    const memory::desc a_md = matrix(in, transposed(transa), m, k, a.ld, a.stride, count);
    const memory::desc b_md = matrix(in, transposed(transb), k, n, b.ld, b.stride, count);
    const memory::desc c_md = matrix(out, false, m, n, c.ld, c.stride, count);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      // dst = alpha * A B + beta * dst: the sum post-op reads C before it is overwritten.
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    try {
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, e.engine);
      it = e.cache.emplace(key, Entry{dnnl::matmul(pd), a_md, b_md, c_md, pd.impl_info_str()}).first;
    } catch (const dnnl::error& err) {
      throw Error("oneDNN has no matrix product for " + type_name(in) + " inputs and " + type_name(out) +
                  " output on this CPU (" + describe() + "): " + err.what() +
                  ". bf16 products need a CPU with AVX-512 (AVX512-BF16 or AMX for speed); configure with "
                  "-DNDMINI_ENABLE_ONEDNN=OFF to emulate them through fp32 BLAS.");
    }
  }
  // Memory objects only wrap the caller's pointers: creating them per call is cheap.
  const Entry& p = it->second;
  memory ma(p.a, e.engine, const_cast<void*>(a.data));  // oneDNN only reads SRC and WEIGHTS
  memory mb(p.b, e.engine, const_cast<void*>(b.data));
  memory mc(p.c, e.engine, c.data);
  it->second.primitive.execute(e.stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  e.stream.wait();
  return it->second.implementation;
}

std::string describe() {
  const dnnl_version_t* v = dnnl_version();
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  // The values of dnnl_cpu_isa_t (stable bit sets), named as oneDNN names them.
  static const std::pair<unsigned, const char*> kIsa[] = {
      {0x0, "all"},
      {0x1, "sse41"},
      {0x3, "avx"},
      {0x7, "avx2"},
      {0x407, "avx2_vnni"},
      {0x27, "avx512_core"},
      {0x67, "avx512_core_vnni"},
      {0xe7, "avx512_core_bf16"},
      {0x3e7, "avx512_core_amx"},
  };
  std::string name = "0x" + [&] {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%x", isa);
    return std::string(buf);
  }();
  for (const auto& [value, label] : kIsa)
    if (value == isa) name = label;
  std::string threads;
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  apply_threads();  // what the products will use, read back from OpenMP
  if (omp_get_max_threads) {
    const int n = omp_get_max_threads();
    threads = ", " + std::to_string(n) + (n == 1 ? " thread" : " threads") + " (OpenMP)";
  }
#endif
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         ", ISA " + name + threads;
}

bool has_bf16() {
  static const bool available = [] {
    std::uint16_t a[16 * 16] = {}, b[16 * 16] = {};  // bf16 zeros
    float c[16 * 16];
    try {
      gemm('N', 'N', 16, 16, 16, 1.0f, Type::bf16, {a, 16, 0}, {b, 16, 0}, 0.0f, Type::f32, {c, 16, 0}, 1);
      return true;
    } catch (const Error&) {
      return false;
    }
  }();
  return available;
}

void use_threads(int threads) {
  g_threads.store(threads, std::memory_order_relaxed);
  apply_threads();
}

}  // namespace ndmini::kernels::onednn
