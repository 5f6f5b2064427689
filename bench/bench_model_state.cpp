// SPDX-License-Identifier: BSD-3-Clause
// Model state per rank, data parallelism versus FSDP, over all launched ranks
// (run under mpiexec -n 1, 2, 4): one training micro-step of the small deck's
// model is timed, and counters report what each rank holds -- parameters,
// gradients and AdamW moments (persistent), and the largest amount of
// gathered parameters and full gradients it held at once (transient).
//   mpiexec -n 2 bench/bench_model_state --benchmark_counters_tabular=true
#include <vector>

#include "bench_common.hpp"
#include "comm/communicator.hpp"
#include "model/gpt.hpp"
#include "parallel/stage_runtime.hpp"

namespace {

using namespace ndmini;

void BM_TrainingMicroStep(benchmark::State& state) {
  const bool fsdp = state.range(0) == 1;
  const bench::Deck& d = bench::kDecks[0];
  const ModelConfig m{d.layers, d.channels, d.heads, d.vocab, bench::kSeqLen};
  Communicator group(MPI_COMM_WORLD, fsdp ? "fsdp" : "dp_replicate");
  ModelParallel par;
  if (fsdp)
    par.data.fsdp = &group;
  else
    par.data.dp_replicate = &group;
  StageRuntime model(m, bench::kBatch, par);
  model.init(1234);
  // Any tokens do: the step's cost does not depend on them.
  TokenView tokens("tokens", bench::kRows), targets("targets", bench::kRows);
  Kokkos::deep_copy(tokens, 7);
  Kokkos::deep_copy(targets, 11);
  for (auto _ : state) {
    bench::time_iteration(state, [&] {
      model.forward_backward(tokens, targets, 1.0f / bench::kRows);
      model.store().finish_grads();
    });
  }
  const double shard = static_cast<double>(model.param_buffer().extent(0)) * sizeof(real);
  state.counters["param_MiB"] = shard / 1048576.0;
  state.counters["grad_MiB"] = shard / 1048576.0;
  state.counters["adamw_MiB"] = 2 * shard / 1048576.0;
  state.counters["state_MiB"] = 4 * shard / 1048576.0;
  state.counters["transient_MiB"] = static_cast<double>(model.store().peak_transient_bytes()) / 1048576.0;
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  state.counters["ranks"] = ranks;
  state.SetLabel(fsdp ? "FSDP over all ranks" : "DP over all ranks");
}
BENCHMARK(BM_TrainingMicroStep)->Arg(0)->Arg(1)->ArgName("fsdp")->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
