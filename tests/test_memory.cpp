// SPDX-License-Identifier: BSD-3-Clause
// The memory estimate against what a run really allocates.
//
// Kokkos Tools' allocation callbacks see every View allocated in the memory
// space the estimate describes (MemSpace); the live bytes of this rank and
// their peak are tracked over a short training run of each layout of the
// equivalence suite (a few steps of the tiny deck, with the validation loss,
// so evaluation runs too). The estimate of the rank's pipeline stage must
// cover that peak, and be within 10% of it: an estimate that misses a buffer
// fails the first check, one that counts buffers that never coexist the second.
// Every layout runs in fp32 and under bf16 mixed precision; on several ranks
// also with bf16 gradient reductions (comm.reduce_dtype). The Llama deck
// runs every layout in fp32 and bf16 as well, and the Mixture-of-Experts deck
// its own layouts (moe_layouts: the routed experts' kept operands and scratch).
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "allocation_tracker.hpp"
#include "config/config.hpp"
#include "equivalence_layouts.hpp"
#include "mesh/mesh.hpp"
#include "parallel/stage_runtime.hpp"
#include "run/layout.hpp"
#include "run/memory_estimate.hpp"
#include "train/trainer.hpp"

using namespace ndmini;
using namespace ndmini::equivalence;
using ndmini::test_support::AllocationTracker;
using ndmini::test_support::train_tracked;

namespace {

// The tiny deck as the equivalence suite runs it (its global batch cut to a
// few micro-batches per rank: few_micro_batches), for 3 steps with the
// validation loss at steps 0 and 2 (no GEMM calibration: its matrices are no training buffer).
// precision "bf16-reduce": bf16 with comm.reduce_dtype = "bf16" (the bf16 copies gradient reductions take).
const std::string kTiny = std::string(NDMINI_SOURCE_DIR) + "/inputs/tiny.toml";
// The Llama deck: RMSNorm (no mean kept), RoPE (no wpe; the positions of all
// rows), SwiGLU (gate, up and their product kept), GQA, untied lm_head.
const std::string kLlama = std::string(NDMINI_SOURCE_DIR) + "/inputs/llama-tiny.toml";
const std::string kMoe = std::string(NDMINI_SOURCE_DIR) + "/inputs/moe-tiny.toml";

Config deck(const Layout& layout, const std::string& precision, const std::string& path) {
  const bool reduce = precision == "bf16-reduce";
  std::vector<std::string> all = {"train.steps=3",
                                  "train.micro_batch=1",
                                  "train.log_every=100",
                                  "train.eval_every=2",
                                  "train.eval_batches=1",
                                  "perf.peak_gflops=30",
                                  "train.precision=" + (reduce ? std::string("bf16") : precision),
                                  std::string("comm.reduce_dtype=") + (reduce ? "bf16" : "fp32")};
  const std::vector<std::string> more = joined(layout);
  all.insert(all.end(), more.begin(), more.end());
  all.push_back(few_micro_batches(path, all, layout.ranks));
  return load_config(path, all);
}

// Every layout of `list` for this world in each of `precisions`, the deck at `path`.
void expect_estimate_covers_the_peak(const std::string& path, const std::vector<std::string>& precisions,
                                     const std::vector<Layout>& list = layouts()) {
  AllocationTracker& tracker = AllocationTracker::get();
  int tested = 0;
  for (const Layout& layout : list) {
    for (const std::string& precision : precisions) {
      if (layout.ranks != world_size() || (precision == "bf16-reduce" && layout.ranks == 1)) continue;
      ++tested;
      const Config cfg = deck(layout, precision, path);
      const RunLayout run_layout = resolve_layout(cfg, world_size());
      // The mesh keeps world ranks (test_mesh), so the stage is the dims' coordinate: no communicators to build.
      const int stage = run_layout.dims.coords_of(world_rank())[static_cast<int>(Axis::pp)];
      const MemoryEstimate estimate = estimate_memory_per_stage(cfg, run_layout)[stage];

      const TrainResult result = train_tracked(cfg, tracker);
      ASSERT_EQ(result.losses.size(), 3u) << label(layout);
      EXPECT_GT(tracker.allocations(), 0u) << "the allocation callbacks saw nothing";

      const double peak = static_cast<double>(tracker.peak()), est = static_cast<double>(estimate.total());
      const double ratio = est / peak;
      // The worst rank's figures, printed once.
      double worst[2] = {ratio, -ratio};
      MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (world_rank() == 0)
        std::printf("[memory] %d ranks, %s%s %-72s estimate / peak: rank 0 %.1f / %.1f KiB, over ranks %.3f .. %.3f\n",
                    layout.ranks,
                    path == kLlama ? "llama "
                    : path == kMoe ? "moe "
                                   : "",
                    precision.c_str(), label(layout).c_str(), est / 1024, peak / 1024, -worst[1], worst[0]);
      const std::string what = label(layout) + " " + precision + ", stage " + std::to_string(stage) + ": estimate " +
                               std::to_string(estimate.state_bytes) + " state + " + std::to_string(estimate.in_flight) +
                               " x " + std::to_string(estimate.activation_bytes_per_micro_batch) + " records + " +
                               std::to_string(estimate.scratch_bytes) +
                               " scratch; live at the peak:" + tracker.peak_breakdown();
      EXPECT_GE(est, peak) << "the estimate misses allocations: " << what;
      EXPECT_LE(est, 1.1 * peak) << "the estimate is over 10% above the peak: " << what;
    }
  }
  EXPECT_GT(tested, 0) << "no layout for " << world_size() << " ranks";
}

}  // namespace

TEST(Memory, EstimateCoversThePeakOfEveryLayoutWithinTenPercent) {
  expect_estimate_covers_the_peak(kTiny, {"fp32", "bf16", "bf16-reduce"});
}

TEST(Memory, LlamaEstimateCoversThePeakOfEveryLayoutWithinTenPercent) {
  expect_estimate_covers_the_peak(kLlama, {"fp32", "bf16"});
}

TEST(Memory, MoeEstimateCoversThePeakOfEveryLayoutWithinTenPercent) {
  if (world_size() == 8) GTEST_SKIP() << "the MoE layouts run on 1, 2 and 4 ranks";
  expect_estimate_covers_the_peak(kMoe, {"fp32", "bf16"}, moe_layouts());
}

TEST(Memory, TrackerCountsEveryByteOfAView) {
  // The measuring side on its own: a View of a known size is its peak, and
  // once freed the next one counts from zero again.
  AllocationTracker& tracker = AllocationTracker::get();
  tracker.reset();
  tracker.install();
  {
    const View1D a("ndmini::test_a", 1000);
    const View1D b("ndmini::test_b", 500);
  }
  const std::uint64_t both = tracker.peak();
  { const View1D c("ndmini::test_c", 200); }
  tracker.uninstall();
  EXPECT_EQ(both, 1500 * sizeof(real));
  EXPECT_EQ(tracker.peak(), 1500 * sizeof(real));
  EXPECT_EQ(tracker.allocations(), 3u);
}
