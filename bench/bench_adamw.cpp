// SPDX-License-Identifier: BSD-3-Clause
// One AdamW update over a whole model's parameters (the trainer's optimizer
// step on one rank): N = the parameter count of each deck, 10.7M and 124M.
// Each element reads and writes p, g, m and v: 32 bytes.
#include <string>

#include "bench_common.hpp"
#include "model/gpt.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

void BM_adamw(benchmark::State& state) {
  const std::size_t n = state.range(0);
  View1D p("p", n), g("g", n), m("m", n), v("v", n);
  // Constants, not random: filling 124M elements with the RNG costs seconds
  // and the update's cost does not depend on the values.
  kernels::fill(p, real(0.02));
  kernels::fill(g, real(1e-3));
  const kernels::AdamWStep step{real(6e-4), real(0.9), real(0.95), real(1e-8), real(0.1), real(1), 1};
  for (auto _ : state) time_iteration(state, [&] { kernels::adamw_update(p, g, m, v, step, true); });
  set_bytes(state, 8.0 * sizeof(real) * n);
}

bool register_all() {
  for (const Deck& d : kDecks) {
    ModelConfig m;
    m.layers = d.layers;
    m.channels = d.channels;
    m.heads = d.heads;
    m.vocab = d.vocab;
    m.seq_len = kSeqLen;
    benchmark::RegisterBenchmark(("adamw/" + std::string(d.name)).c_str(), BM_adamw)
        ->ArgName("N")
        ->Arg(gpt_param_count(m))
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}

const bool registered = register_all();

}  // namespace
