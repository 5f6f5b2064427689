// SPDX-License-Identifier: BSD-3-Clause
// Layer norm forward and backward over 1024 rows (one micro-batch) at the
// decks' widths. Memory-bound, so the counter is bytes/s of the compulsory
// traffic: every array read or written once. The kernels' extra passes over
// a row hit cache, so this is the rate comparable with STREAM.
#include "bench_common.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

struct LayerNormBuffers {
  View2D x, out, dout, dx;
  View1D weight, bias, dweight, dbias, mean, rstd;
  LayerNormBuffers(int rows, int C)
      : x("x", rows, C),
        out("out", rows, C),
        dout("dout", rows, C),
        dx("dx", rows, C),
        weight("weight", C),
        bias("bias", C),
        dweight("dweight", C),
        dbias("dbias", C),
        mean("mean", rows),
        rstd("rstd", rows) {
    randomize(flat(x), 1, 1);
    randomize(flat(dout), 2);
    kernels::fill(weight, 1);
    randomize(bias, 3);
  }
};

void BM_layernorm_forward(benchmark::State& state) {
  const int rows = state.range(0), C = state.range(1);
  LayerNormBuffers b(rows, C);
  for (auto _ : state)
    time_iteration(state, [&] { kernels::layernorm_forward(b.out, b.mean, b.rstd, b.x, b.weight, b.bias); });
  // read x, weight, bias; write out, mean, rstd
  set_bytes(state, sizeof(real) * (2.0 * rows * C + 2.0 * C + 2.0 * rows));
}

void BM_layernorm_backward(benchmark::State& state) {
  const int rows = state.range(0), C = state.range(1);
  LayerNormBuffers b(rows, C);
  kernels::layernorm_forward(b.out, b.mean, b.rstd, b.x, b.weight, b.bias);  // the saved statistics
  for (auto _ : state)
    time_iteration(
        state, [&] { kernels::layernorm_backward(b.dx, b.dweight, b.dbias, b.dout, b.x, b.weight, b.mean, b.rstd); });
  // read x, dout, weight, mean, rstd; read and write dx, dweight, dbias (all accumulate)
  set_bytes(state, sizeof(real) * (4.0 * rows * C + 5.0 * C + 2.0 * rows));
}

BENCHMARK(BM_layernorm_forward)
    ->ArgNames({"rows", "C"})
    ->Args({kRows, 384})
    ->Args({kRows, 768})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_backward)
    ->ArgNames({"rows", "C"})
    ->Args({kRows, 384})
    ->Args({kRows, 768})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
