// SPDX-License-Identifier: BSD-3-Clause
// The guards around training: the memory estimate that refuses a deck before
// anything is allocated (against the model's own byte counts), the closed-form
// parameter count (against the layout it summarizes), metrics write errors,
// the fault plan's firing rules, and the checks on every file read.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "fault/fault.hpp"
#include "mesh/mesh.hpp"
#include "model/gpt.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "run/budget.hpp"
#include "run/layout.hpp"
#include "run/memory_estimate.hpp"
#include "train/metrics.hpp"

using namespace ndmini;

namespace {

Config deck(const std::vector<std::string>& overrides = {}) {
  return parse_config(
      "[model]\nlayers = 3\nchannels = 48\nheads = 4\nvocab = 96\nseq_len = 16\n[train]\nmicro_batch = 2\n"
      "global_batch = 8\nsteps = 10\n",
      "deck.toml", overrides);
}

RunLayout one_rank(const Config& c) { return resolve_layout(c, 1); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Guards, ClosedFormParamCountMatchesTheLayout) {
  for (const auto& m : {ModelConfig{1, 8, 2, 11, 5}, ModelConfig{3, 48, 4, 96, 16},
                        ModelConfig{12, 768, 12, 50304, 256}, ModelConfig{2, 64, 4, 256, 64}}) {
    std::int64_t sum = 0;
    for (const auto& p : gpt_param_layout(m, StagePlan(m.layers, 1, 1).chunks_of(0)).params)
      sum += static_cast<std::int64_t>(p.size);
    EXPECT_EQ(gpt_param_count(m), sum) << m.layers << " layers, C = " << m.channels;
  }
  EXPECT_EQ(gpt_param_count(ModelConfig{12, 768, 12, 50304, 1024}), 124475904);  // GPT-2 small, padded vocabulary
}

// On one rank the model state is four float copies of the flat parameter
// buffer (every parameter, each padded to 64 bytes); tp with SP splits the big
// matrices and the activations, FSDP shards the state. (test_memory checks
// the estimate against real allocations.)
TEST(Guards, EstimateFollowsTheLayout) {
  const Config c = deck();
  const MemoryEstimate e = estimate_memory(c, one_rank(c));
  const ParamLayout flat = gpt_param_layout(c.model, StagePlan(c.model.layers, 1, 1).chunks_of(0));
  EXPECT_EQ(e.state_bytes, 4 * static_cast<std::int64_t>(sizeof(real) * flat.total));
  EXPECT_GE(static_cast<std::int64_t>(flat.total), gpt_param_count(c.model));
  EXPECT_EQ(data_bytes(c), 0);
  const Config tp2 = deck({"parallel.tp=2", "parallel.sequence_parallel=true"});
  EXPECT_LT(estimate_memory(tp2, resolve_layout(tp2, 2)).state_bytes, 0.6 * e.state_bytes);
  EXPECT_LT(estimate_memory(tp2, resolve_layout(tp2, 2)).activation_bytes_per_micro_batch,
            0.6 * e.activation_bytes_per_micro_batch);
  // With many units the shard dominates the two gathered at a time.
  const Config deep = deck({"model.layers=24"}), deep4 = deck({"model.layers=24", "parallel.dp_shard=4"});
  EXPECT_LT(estimate_memory(deep4, resolve_layout(deep4, 4)).state_bytes,
            0.4 * estimate_memory(deep, one_rank(deep)).state_bytes);
  // The parts a refusal names add up to the estimate.
  double sum = 0;
  for (const MemoryPart& p : memory_parts(c, one_rank(c))) sum += p.bytes;
  EXPECT_DOUBLE_EQ(sum, static_cast<double>(e.total()));
}

TEST(Guards, HugeDecksAreRefusedNamingTheKey) {
  struct Case {
    std::string set, key;
  };
  for (const auto& k : {Case{"model.layers=1000000000", "model.layers = 1000000000"},
                        Case{"model.channels=1048576", "model.channels = 1048576"},
                        Case{"model.seq_len=1000000000", "model.seq_len = 1000000000"},
                        Case{"model.vocab=2000000000", "model.vocab = 2000000000"}}) {
    const Config c = deck({k.set});
    const std::string msg = error_of([&] { require_memory_fits(c, one_rank(c), 1); });
    EXPECT_TRUE(contains(msg, k.key)) << msg;
    EXPECT_TRUE(contains(msg, "one rank may use")) << msg;
  }
  // The deck limit refuses what the node would take; a generous one lets it pass.
  const std::string msg =
      error_of([&] { require_memory_fits(deck({"perf.memory_per_rank_gib=0.0001"}), one_rank(deck()), 1); });
  EXPECT_TRUE(contains(msg, "(perf.memory_per_rank_gib = 0.0001)")) << msg;
  EXPECT_NO_THROW(require_memory_fits(deck({"perf.memory_per_rank_gib=1"}), one_rank(deck()), 1));
  // Sharing the node divides what each rank may use.
  std::string how;
  const double alone = memory_per_rank(deck(), 1, &how), shared = memory_per_rank(deck(), 4, &how);
  EXPECT_NEAR(shared * 4, alone, 0.25 * alone);  // MemAvailable moves between the reads (ctest -j runs others)
  EXPECT_TRUE(contains(how, "/ 4 ranks")) << how;
}

TEST(Guards, MetricsWriteErrorsAreKept) {
  MetricsWriter full("/dev/full");
  EXPECT_EQ(full.error(), "");
  StepRecord r;
  full.step(r);
  EXPECT_TRUE(contains(full.error(), "--metrics /dev/full: writing the metrics failed (No space left on device)"))
      << full.error();
  MetricsWriter none("");
  none.step(r);
  EXPECT_EQ(none.error(), "");
}

TEST(Guards, FaultPlanFiresOnlyWhereItIsAimed) {
  FaultConfig f;
  EXPECT_TRUE(fault::FaultPlan(f, 0, 2).none());
  f.kind = FaultKind::nan;
  f.rank = 1;
  f.step = 3;
  EXPECT_FALSE(fault::FaultPlan(f, 0, 2).nan_at(3));  // another rank
  EXPECT_FALSE(fault::FaultPlan(f, 1, 2).nan_at(2));  // another step
  EXPECT_TRUE(fault::FaultPlan(f, 1, 2).nan_at(3));
  EXPECT_TRUE(
      contains(error_of([&] { fault::FaultPlan(f, 0, 1); }), "fault.rank = 1 is not a rank of this job (1 rank)"));

  f.kind = FaultKind::skip_collective;
  const fault::FaultPlan skip(f, 0, 4);
  EXPECT_TRUE(skip.skip_collective_at(3, 1));
  EXPECT_FALSE(skip.skip_collective_at(3, 0));
  EXPECT_FALSE(skip.skip_collective_at(4, 1));
  EXPECT_FALSE(skip.nan_at(3));
  EXPECT_FALSE(static_cast<bool>(skip.save_hook()));

  f.kind = FaultKind::enospc;
  f.phase = SavePhase::close;
  f.rank = 0;
  f.step = 4;
  const auto hook = fault::FaultPlan(f, 0, 2).save_hook();
  ASSERT_TRUE(static_cast<bool>(hook));
  EXPECT_NO_THROW(hook(SavePhase::write, 4, "f.h5"));
  EXPECT_NO_THROW(hook(SavePhase::close, 2, "f.h5"));
  const std::string msg = error_of([&] { hook(SavePhase::close, 4, "ckpt/.step_00000004.tmp/checkpoint.h5"); });
  EXPECT_EQ(msg,
            "'ckpt/.step_00000004.tmp/checkpoint.h5': No space left on device (injected by fault.kind = \"enospc\")");
  EXPECT_FALSE(static_cast<bool>(fault::FaultPlan(f, 1, 2).save_hook()));  // not aimed at rank 1
}

// read_small_file takes a file of exactly its limit and refuses one byte more,
// from the size alone or, for a file reporting no size (/proc), while reading;
// anything but a regular file is refused by its kind, without blocking.
TEST(Guards, SmallFilesAreRegularAndBounded) {
  const std::string path = "ndmini_test_guards_" + std::to_string(::getpid());
  const FileUse use{"deck '" + path + "'", "name a .toml file"};
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs(std::string(64, 'x').c_str(), f);
  std::fclose(f);
  EXPECT_EQ(read_small_file(path, 64, use), std::string(64, 'x'));
  EXPECT_EQ(error_of([&] { read_small_file(path, 63, use); }),
            "deck '" + path + "' has 64 bytes; ndmini reads at most 63 bytes from it; name a .toml file");
  std::remove(path.c_str());
  EXPECT_EQ(error_of([&] { read_small_file(path, 64, use); }), "deck '" + path + "' does not exist; name a .toml file");

  const std::string status = read_small_file("/proc/self/status", kProcFileMaxBytes, use);  // reports size 0
  EXPECT_TRUE(contains(status, "VmHWM:")) << status;
  EXPECT_TRUE(contains(error_of([&] { read_small_file("/proc/self/status", 16, use); }), "more than 16 bytes"));
  EXPECT_GT(peak_rss_bytes(), 0);

  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);  // no writer: an open for reading would block
  EXPECT_EQ(error_of([&] { read_small_file(path, 64, use); }),
            "deck '" + path + "' is a FIFO (named pipe), not a regular file; name a .toml file");
  EXPECT_TRUE(contains(error_of([&] { RegularFile file(path, use); }), "is a FIFO (named pipe)"));
  std::remove(path.c_str());
  EXPECT_TRUE(contains(error_of([&] { read_small_file("/dev/zero", 64, use); }), "is a character device"));
  EXPECT_TRUE(contains(error_of([&] { require_regular_file(".", use); }), "is a folder, not a regular file"));
}
