// SPDX-License-Identifier: BSD-3-Clause
// The profiling regions a Kokkos tool sees during training: registered here
// through Kokkos' tool callbacks (what a Kokkos Tools library does), every
// phase of a step must appear by name, and pushes and pops must balance.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "train/trainer.hpp"

using namespace ndmini;

namespace {

std::set<std::string> seen;
std::set<std::pair<std::string, std::string>> nested;  // (enclosing region, region)
std::vector<std::string> open_regions;
bool popped_below_zero = false;

void on_push(const char* name) {
  seen.insert(name);
  if (!open_regions.empty()) nested.insert({open_regions.back(), name});
  open_regions.push_back(name);
}
void on_pop() {
  if (open_regions.empty())
    popped_below_zero = true;
  else
    open_regions.pop_back();
}

bool nested_in(const std::string& outer, const std::string& inner) { return nested.count({outer, inner}) == 1; }

// The regions of a short run of `overrides` on MPI_COMM_WORLD.
std::set<std::string> regions_of(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"train.steps=2", "perf.peak_gflops=100", "train.log_every=100"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  const Config cfg = load_config(std::string(NDMINI_SOURCE_DIR) + "/inputs/tiny.toml", all);
  seen.clear();
  nested.clear();
  open_regions.clear();
  popped_below_zero = false;
  Kokkos::Tools::Experimental::set_push_region_callback(on_push);
  Kokkos::Tools::Experimental::set_pop_region_callback(on_pop);
  TrainOptions opts;
  opts.quiet = true;
  train(cfg, opts, MPI_COMM_WORLD);
  Kokkos::Tools::Experimental::set_push_region_callback(nullptr);
  Kokkos::Tools::Experimental::set_pop_region_callback(nullptr);
  return seen;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void expect_regions(const std::set<std::string>& got, const std::vector<std::string>& want) {
  for (const auto& name : want) EXPECT_EQ(got.count(name), 1u) << "missing region '" << name << "'";
  EXPECT_TRUE(open_regions.empty()) << "pushes and pops do not balance";
  EXPECT_FALSE(popped_below_zero);
}

}  // namespace

TEST(Profiling, EveryPhaseOfAStepIsARegion) {
  if (world_size() == 1) {
    // tiny.toml has 2 layers; recompute adds its own region.
    const std::string dir = "profiling_ckpt_" + std::to_string(::getpid());
    const auto got =
        regions_of({"train.recompute=block", "train.eval_every=1", "checkpoint.every=1", "checkpoint.dir=" + dir});
    std::filesystem::remove_all(dir);
    expect_regions(got,
                   {"ndmini::step 0", "ndmini::step 1", "ndmini::embedding forward", "ndmini::block 0 forward",
                    "ndmini::block 1 forward", "ndmini::head forward and backward", "ndmini::block 1 recompute",
                    "ndmini::block 1 backward", "ndmini::block 0 backward", "ndmini::embedding backward",
                    "ndmini::finish gradient reductions", "ndmini::optimizer", "ndmini::comm batch all_reduce_scalar",
                    "ndmini::comm norm all_reduce_scalar", "ndmini::checkpoint save", "ndmini::validation loss"});
    EXPECT_TRUE(nested_in("ndmini::step 1", "ndmini::block 0 forward"));
    EXPECT_TRUE(nested_in("ndmini::block 1 backward", "ndmini::block 1 recompute"));
  } else {
    // A pipeline of 2 stages: its waits and the pp and tied-embedding groups' traffic.
    const auto got = regions_of({"parallel.pp=2"});
    expect_regions(got, {"ndmini::step 0", "ndmini::optimizer", "ndmini::pipeline wait for the last sends",
                         "ndmini::comm tied_wte all_reduce"});
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // FSDP: the all-gather of a block's parameters is waited for inside that block.
    const auto fsdp = regions_of({"parallel.dp_shard=2"});
    EXPECT_TRUE(nested_in("ndmini::block 1 forward", "ndmini::comm fsdp wait for all_gather"));
    EXPECT_TRUE(nested_in("ndmini::block 1 backward", "ndmini::comm fsdp wait for all_gather"));
    // Stage 1 waits for stage 0's activations, stage 0 for stage 1's gradients.
    expect_regions(
        got, {rank == 1 ? "ndmini::pipeline wait for the previous stage" : "ndmini::pipeline wait for the next stage",
              rank == 0 ? "ndmini::block 0 forward" : "ndmini::block 1 backward"});
  }
}
