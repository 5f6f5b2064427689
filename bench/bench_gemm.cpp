// SPDX-License-Identifier: BSD-3-Clause
// GEMM rates at the exact shapes the model runs (one micro-batch of 1024
// rows), through ndmini::kernels::gemm (KokkosBlas::gemm on the host, cuBLAS on CUDA). Each
// Linear weight W [out, in] is used three ways:
//   fwd  y  = x W^T    "N","T"  [rows, in] x [out, in]^T
//   dW  dW += dy^T x   "T","N"  [rows, out]^T x [rows, in]
//   dx  dx  = dy W     "N","N"  [rows, out] x [out, in]
// plus the 1024^3 square "N","T" GEMM the trainer calibrates MFU against.
#include <string>

#include "bench_common.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

enum class Pass { fwd, dW, dx };

struct Layer {
  const char* name;
  int in, out;
  bool has_bias;  // its forward seeds y with the bias, so GEMM runs with beta = 1
};

void BM_gemm(benchmark::State& state, Pass pass, int rows, int in, int out, bool has_bias) {
  // The operands and result of each pass, and BLAS's op flags.
  const char *ta = "N", *tb = "T";
  int am = rows, an = in, bm = out, bn = in, cm = rows, cn = out;  // fwd
  real beta = has_bias ? 1 : 0;
  if (pass == Pass::dW) {
    ta = "T", tb = "N", am = rows, an = out, bm = rows, bn = in, cm = out, cn = in, beta = 1;
  } else if (pass == Pass::dx) {
    ta = "N", tb = "N", am = rows, an = out, bm = out, bn = in, cm = rows, cn = in, beta = 0;
  }
  View2D a("a", am, an), b("b", bm, bn), c("c", cm, cn);
  randomize(flat(a), 1);
  randomize(flat(b), 2);
  randomize(flat(c), 3);
  for (auto _ : state) time_iteration(state, [&] { kernels::gemm(ta, tb, real(1), a, b, beta, c); });
  set_flops(state, 2.0 * rows * in * out);
  state.SetLabel("M=" + std::to_string(cm) + " N=" + std::to_string(cn) + " K=" +
                 std::to_string(pass == Pass::dW   ? rows
                                : pass == Pass::dx ? out
                                                   : in));
}

bool register_all() {
  for (const Deck& d : kDecks) {
    const int C = d.channels;
    const Layer layers[] = {{"c_attn", C, 3 * C, true},
                            {"attn_proj", C, C, true},
                            {"c_fc", C, 4 * C, true},
                            {"mlp_proj", 4 * C, C, true},
                            {"lm_head", C, d.vocab, false}};
    for (const Layer& l : layers)
      for (auto [pass, tag] : {std::pair{Pass::fwd, "fwd_NT"}, {Pass::dW, "dW_TN"}, {Pass::dx, "dx_NN"}}) {
        const std::string name = std::string("gemm/") + d.name + "/" + l.name + "/" + tag;
        benchmark::RegisterBenchmark(name.c_str(), BM_gemm, pass, kRows, l.in, l.out, l.has_bias)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
  }
  // As in ndmini::calibrate_gemm_flops(): y = a b^T, all 1024 x 1024.
  benchmark::RegisterBenchmark("gemm/calibration/square1024/fwd_NT", BM_gemm, Pass::fwd, 1024, 1024, 1024, false)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  return true;
}

const bool registered = register_all();

}  // namespace
