// SPDX-License-Identifier: BSD-3-Clause
// The fused softmax cross-entropy (loss and dlogits in place) over 1024 rows
// at both decks' vocabularies. bytes/s counts one read and one write of the
// logits plus targets and losses, the traffic the kernel is designed for.
#include <vector>

#include "bench_common.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

void BM_softmax_cross_entropy(benchmark::State& state) {
  const int rows = state.range(0), V = state.range(1);
  View2D logits("logits", rows, V);
  View1D losses("losses", rows);
  TokenView targets("targets", rows);
  randomize(flat(logits), 1, 1);
  auto h_targets = Kokkos::create_mirror_view(targets);
  for (int i = 0; i < rows; ++i) h_targets(i) = static_cast<token_t>((i * 7919L) % V);
  Kokkos::deep_copy(targets, h_targets);
  // Later iterations see the previous dlogits instead of fresh logits: the
  // cost does not depend on the values (no branches), and they stay finite.
  for (auto _ : state)
    time_iteration(state, [&] {
      benchmark::DoNotOptimize(kernels::softmax_cross_entropy(logits, losses, targets, real(1) / rows));
    });
  set_bytes(state, 2.0 * rows * V * sizeof(real) + rows * (sizeof(token_t) + sizeof(real)));
}

BENCHMARK(BM_softmax_cross_entropy)
    ->ArgNames({"rows", "V"})
    ->Args({kRows, 256})
    ->Args({kRows, 50304})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
