// SPDX-License-Identifier: BSD-3-Clause
// The unit events a real training step executes against the list the
// memory estimate and the planner replay (parallel/unit_events.hpp).
//
// Both sides are built by stage_unit_events()/unit_events(); the runtime
// must walk them in the order the pipeline runs its actions, and nothing
// else. One step of every layout of the equivalence suite (dp, FSDP/HSDP,
// reshard_after_forward = false, tp, sp, cp, pp schedules, recompute) in
// fp32, and those with FSDP also under bf16 with bf16 reductions, must record
// exactly the stage's replayed list. A forward-only pass is checked on one rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "equivalence_layouts.hpp"
#include "mesh/mesh.hpp"
#include "parallel/stage_runtime.hpp"
#include "parallel/unit_events.hpp"
#include "run/layout.hpp"
#include "run/memory_estimate.hpp"
#include "train/capture.hpp"
#include "train/trainer.hpp"

using namespace ndmini;
using namespace ndmini::equivalence;

namespace {

// The tiny deck for one step, without the validation loss (its forward-only
// pass is the second test's) or GEMM calibration. The global batch is cut
// to a few micro-batches per rank (at least pp, so every schedule reaches
// its steady state): seconds, not minutes.
Config deck(const Layout& layout, const std::string& precision) {
  std::vector<std::string> all = {"train.steps=1",      "train.micro_batch=1", "train.log_every=100",
                                  "train.eval_every=0", "perf.peak_gflops=30", "train.precision=" + precision};
  if (precision == "bf16" && layout.ranks > 1) all.push_back("comm.reduce_dtype=bf16");
  const std::vector<std::string> more = joined(layout);
  all.insert(all.end(), more.begin(), more.end());
  const std::string tiny = std::string(NDMINI_SOURCE_DIR) + "/inputs/tiny.toml";
  const Config cfg = load_config(tiny, all);
  const ParallelDims d = resolve_layout(cfg, layout.ranks).dims;
  const int micro_batches = std::max(2, d.pp);
  all.push_back("train.global_batch=" +
                std::to_string(micro_batches * cfg.train.micro_batch * d.dp_replicate * d.dp_shard));
  return load_config(tiny, all);
}

// Empty when equal; else where they part.
std::string difference(const std::vector<UnitEvent>& executed, const std::vector<UnitEvent>& replayed) {
  for (std::size_t i = 0; i < std::min(executed.size(), replayed.size()); ++i)
    if (executed[i] != replayed[i])
      return "event " + std::to_string(i) + ": executed " + describe(executed[i]) + ", replayed " +
             describe(replayed[i]);
  if (executed.size() != replayed.size())
    return std::to_string(executed.size()) + " events executed, " + std::to_string(replayed.size()) + " replayed";
  return "";
}

}  // namespace

TEST(UnitEvents, ATrainingStepExecutesTheListTheEstimateReplays) {
  int tested = 0;
  for (const Layout& layout : layouts()) {
    if (layout.ranks != world_size()) continue;
    for (const std::string precision : {"fp32", "bf16"}) {
      // bf16 changes what a gather moves, not the sequence: FSDP's layouts suffice.
      if (precision == "bf16" && label(layout).find("dp_shard") == std::string::npos) continue;
      ++tested;
      const Config cfg = deck(layout, precision);
      const RunLayout run = resolve_layout(cfg, world_size());
      // The mesh keeps world ranks (test_mesh), so the stage is the dims' coordinate: no communicators to build.
      const int stage = run.dims.coords_of(world_rank())[static_cast<int>(Axis::pp)];
      // What gpt_memory_estimate and fsdp_traffic replay for this stage.
      const std::vector<UnitEvent> replayed =
          stage_unit_events(run.plan.chunks_of(stage), run.schedule.actions(stage),
                            {reshard_of(cfg.parallel.reshard_after_forward), run.recompute, Pass::train});

      TrainCapture capture;
      TrainOptions opts;
      opts.quiet = true;
      opts.capture = &capture;
      const TrainResult result = train(cfg, opts, MPI_COMM_WORLD);
      ASSERT_EQ(result.losses.size(), 1u) << label(layout);

      const std::string what = label(layout) + " " + precision + ", stage " + std::to_string(stage);
      EXPECT_FALSE(replayed.empty()) << what;
      EXPECT_EQ(difference(capture.unit_events, replayed), "") << what;
      int bad = difference(capture.unit_events, replayed).empty() ? 0 : 1;
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (world_rank() == 0)
        std::printf("[unit events] %d ranks, %s %-64s rank 0: %zu events, %s\n", layout.ranks, precision.c_str(),
                    label(layout).c_str(), replayed.size(), bad ? "MISMATCH on some rank" : "same on every rank");
    }
  }
  EXPECT_GT(tested, 0) << "no layout for " << world_size() << " ranks";
}

TEST(UnitEvents, AForwardOnlyPassExecutesTheEvaluationList) {
  if (world_size() != 1) GTEST_SKIP() << "one rank holding the whole model";
  const Config cfg = load_config(std::string(NDMINI_SOURCE_DIR) + "/inputs/tiny.toml", {"train.micro_batch=1"});
  StageRuntime gpt(cfg.model, 1);
  gpt.init(1);
  std::vector<UnitEvent> executed;
  gpt.record_unit_events(&executed);
  const TokenView tokens("tokens", cfg.model.seq_len);  // token 0 everywhere
  gpt.forward_loss(tokens, tokens);

  const Chunk& whole = gpt.chunks().front();
  std::vector<UnitEvent> replayed =
      unit_events(whole, gpt_chunk_units(gpt.chunks()).front(), PipelineAction::Kind::forward,
                  {Reshard::after_forward, Recompute::none, Pass::evaluation});
  const std::vector<UnitEvent> end = end_of_evaluation_events(gpt.store().units());
  replayed.insert(replayed.end(), end.begin(), end.end());
  EXPECT_EQ(difference(executed, replayed), "");
  // Forward only: nothing opens gradients.
  for (const UnitEvent& e : executed) EXPECT_NE(e.op, UnitOp::open_grads) << describe(e);
}
