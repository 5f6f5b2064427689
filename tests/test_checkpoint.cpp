// SPDX-License-Identifier: BSD-3-Clause
// Checkpoints: round trip, resharding, attributes, commit and pruning, and the
// refusal of corrupted, truncated, missing or mismatched checkpoints. Values are
// made from the global index and loaded into zeros, so a no-op load or a block
// read from the wrong place fails. Runs with 1 and 2 ranks.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;
using ndmini::io::CheckpointInfo;
using ndmini::io::TensorSlab;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int nranks() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Distinct per tensor (salt) and element, exact in float32.
float value(int salt, std::uint64_t global_index) {
  return static_cast<float>(salt) * 65536.0f + static_cast<float>(global_index) + 0.5f;
}

// How a layout splits each tensor over the ranks.
enum class Split { kFirstDim, kMiddleDim, kLastDim, kRankZero };

// One rank's block of one tensor, with the memory behind it.
struct Block {
  std::string name;
  std::vector<std::uint64_t> shape, offset, count;
  std::vector<float> data;
  int salt = 0;

  TensorSlab slab() { return TensorSlab{name, shape, offset, count, data.empty() ? nullptr : data.data()}; }

  // Calls f(local index, global linear index) over the block, row-major.
  void for_each(const std::function<void(std::size_t, std::uint64_t)>& f) const {
    std::uint64_t n = 1;
    for (auto c : count) n *= c;
    for (std::uint64_t local = 0; local < n; ++local) {
      std::uint64_t rest = local, global = 0, stride = 1;
      std::vector<std::uint64_t> idx(shape.size());
      for (std::size_t d = shape.size(); d-- > 0;) {
        idx[d] = rest % count[d];
        rest /= count[d];
      }
      for (std::size_t d = shape.size(); d-- > 0;) {
        global += (offset[d] + idx[d]) * stride;
        stride *= shape[d];
      }
      f(local, global);
    }
  }
};

Block make_block(const std::string& name, std::vector<std::uint64_t> shape, Split split, int salt, bool fill) {
  Block b;
  b.name = name;
  b.shape = shape;
  b.salt = salt;
  b.offset.assign(shape.size(), 0);
  b.count = shape;
  if (split == Split::kRankZero) {
    if (rank() != 0) b.count.assign(shape.size(), 0);
  } else {
    const std::size_t dim = split == Split::kFirstDim  ? 0
                            : split == Split::kLastDim ? shape.size() - 1
                                                       : std::min<std::size_t>(1, shape.size() - 1);
    const std::uint64_t n = shape[dim], r = rank(), p = nranks();
    b.offset[dim] = r * n / p;
    b.count[dim] = (r + 1) * n / p - r * n / p;
  }
  std::uint64_t elements = 1;
  for (auto c : b.count) elements *= c;
  b.data.assign(elements, 0.0f);
  if (fill) b.for_each([&](std::size_t i, std::uint64_t g) { b.data[i] = value(salt, g); });
  return b;
}

// A small model: 1-D, 2-D and 3-D tensors, uneven splits, and a tensor that
// only rank 0 holds (the others take part with an empty selection).
std::vector<Block> make_model(Split split, int salt, bool fill) {
  return {
      make_block("model/h/0/attn/c_attn/weight", {12, 10}, split, salt + 1, fill),
      make_block("model/h/0/attn/c_attn/bias", {10}, split, salt + 2, fill),
      make_block("model/wpe/weight", {3, 4, 5}, split, salt + 3, fill),
      make_block("optimizer/exp_avg/h/0/attn/c_attn/weight", {12, 10}, split, salt + 4, fill),
      make_block("model/ln_f/bias", {5}, Split::kRankZero, salt + 5, fill),
  };
}

std::vector<TensorSlab> slabs(std::vector<Block>& blocks) {
  std::vector<TensorSlab> out;
  for (auto& b : blocks) out.push_back(b.slab());
  return out;
}

// Number of elements that differ (bitwise) from the values of `salt`.
std::size_t mismatches(const std::vector<Block>& blocks, int salt_base) {
  std::size_t bad = 0;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const Block& b = blocks[k];
    const int salt = salt_base + static_cast<int>(k) + 1;
    b.for_each([&](std::size_t i, std::uint64_t g) {
      const float want = value(salt, g);
      if (std::memcmp(&b.data[i], &want, sizeof want) != 0) ++bad;
    });
  }
  return bad;
}

CheckpointInfo info_for(std::int64_t step) {
  CheckpointInfo info;
  info.step = step;
  info.consumed_tokens = 1000 * step;
  info.seed = 1234;
  info.config = "[model]\nn_layer = 1\n";
  info.layout = "pp=1 dp_replicate=1 dp_shard=" + std::to_string(nranks()) + " cp=1 tp=1";
  return info;
}

// The message of the ndmini::Error that f throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ndmini::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A fresh folder per test (named by rank 0's PID and the test), removed afterwards.
class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string path;
    if (rank() == 0) {
      const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
      path = (fs::temp_directory_path() / ("ndmini_ckpt_" + std::to_string(::getpid()) + "_" + test->name())).string();
      fs::remove_all(path);
      fs::create_directories(path);
    }
    unsigned long n = path.size();
    MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
    path.resize(n);
    MPI_Bcast(path.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
    dir_ = path;
    root_ = path + "/ckpt";
  }

  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir_);
  }

  void save(std::int64_t step, int salt, Split split = Split::kFirstDim, int keep = 3) {
    auto blocks = make_model(split, salt, true);
    ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(step), slabs(blocks), keep);
  }

  // Loads into zeros under `split` and returns the number of wrong elements.
  std::size_t load_and_count(std::optional<std::int64_t> step, int salt, Split split = Split::kFirstDim) {
    auto blocks = make_model(split, salt, false);
    ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, step, slabs(blocks));
    return mismatches(blocks, salt);
  }

  std::string file_of(std::int64_t step) const {
    return root_ + "/" + ndmini::io::checkpoint_dirname(step) + "/checkpoint.h5";
  }

  std::string dir_, root_;
};

// Flips every bit of the byte in the middle of `path`; returns whether it changed.
bool flip_middle_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto middle = static_cast<std::streamoff>(fs::file_size(path) / 2);
  char c = 0;
  f.seekg(middle);
  f.get(c);
  f.seekp(middle);
  f.put(static_cast<char>(~c));
  f.close();
  std::ifstream check(path, std::ios::binary);
  check.seekg(middle);
  char d = 0;
  check.get(d);
  return d == static_cast<char>(~c);
}

TEST_F(Checkpoint, RoundTripSameLayout) {
  save(1, 10);
  EXPECT_EQ(load_and_count(1, 10), 0u);
  // Negative control: the expected values of another salt must not match.
  EXPECT_GT(load_and_count(1, 20), 0u);
}

TEST_F(Checkpoint, ReshardsBetweenLayouts) {
  // On one rank every split is the whole tensor; on two ranks these are real reshards.
  save(1, 10, Split::kFirstDim);
  EXPECT_EQ(load_and_count(1, 10, Split::kLastDim), 0u);
  EXPECT_EQ(load_and_count(1, 10, Split::kMiddleDim), 0u);
  EXPECT_EQ(load_and_count(1, 10, Split::kRankZero), 0u);
  save(2, 30, Split::kRankZero);
  EXPECT_EQ(load_and_count(2, 30, Split::kFirstDim), 0u);
  EXPECT_EQ(load_and_count(2, 30, Split::kLastDim), 0u);
}

TEST_F(Checkpoint, AttributesRoundTrip) {
  CheckpointInfo info;
  info.step = 7;
  info.consumed_tokens = 123456789012345;
  info.seed = 0xFEDCBA9876543210ull;
  info.config = "[model]\nn_layer = 2\nname = \"tiny \xc3\xbc\"\n";
  info.layout = "pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=1";
  auto blocks = make_model(Split::kFirstDim, 0, true);
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info, slabs(blocks), 3);
  auto zeros = make_model(Split::kFirstDim, 0, false);
  const CheckpointInfo got = ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, std::nullopt, slabs(zeros));
  EXPECT_EQ(got.step, info.step);
  EXPECT_EQ(got.consumed_tokens, info.consumed_tokens);
  EXPECT_EQ(got.seed, info.seed);
  EXPECT_EQ(got.config, info.config);
  EXPECT_EQ(got.layout, info.layout);

  CheckpointInfo empty;  // empty strings and zeros survive too
  empty.step = 8;
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, empty, slabs(blocks), 3);
  const CheckpointInfo got2 = ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, 8, slabs(zeros));
  EXPECT_EQ(got2.step, 8);
  EXPECT_EQ(got2.seed, 0u);
  EXPECT_EQ(got2.config, "");
  EXPECT_EQ(got2.layout, "");
}

TEST_F(Checkpoint, LatestPointsAtNewestAndKeepPrunes) {
  EXPECT_FALSE(ndmini::io::latest_step(MPI_COMM_WORLD, root_).has_value());
  if (rank() == 0) {  // debris of a save that died
    fs::create_directories(root_ + "/.step_00000009.tmp");
    std::ofstream(root_ + "/.step_00000009.tmp/checkpoint.h5") << "partial";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (std::int64_t step = 1; step <= 3; ++step) {
    save(step, static_cast<int>(100 * step), Split::kFirstDim, 2);
    EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), std::optional<std::int64_t>(step));
  }
  if (rank() == 0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000002", "step_00000003"}));
    std::ifstream latest(root_ + "/latest");
    std::string text;
    std::getline(latest, text);
    EXPECT_EQ(text, "3");
  }
  EXPECT_EQ(load_and_count(std::nullopt, 300), 0u);
  EXPECT_EQ(load_and_count(2, 200), 0u);

  // Saving a step again (a run resumed from an earlier step) replaces it.
  save(3, 333, Split::kFirstDim, 2);
  EXPECT_EQ(load_and_count(std::nullopt, 333), 0u);
  EXPECT_EQ(load_and_count(2, 200), 0u);
}

TEST_F(Checkpoint, CorruptedFileIsRefusedAndPreviousStillLoads) {
  save(1, 10);
  save(2, 20);
  int flipped = 0;
  if (rank() == 0) flipped = flip_middle_byte(file_of(2));
  MPI_Bcast(&flipped, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_TRUE(flipped);  // the fault really fired
  const std::string msg = error_of([&] { load_and_count(std::nullopt, 20); });
  EXPECT_TRUE(contains(msg, "corrupted")) << msg;
  EXPECT_TRUE(contains(msg, file_of(2))) << msg;
  EXPECT_TRUE(contains(msg, "--resume")) << msg;
  EXPECT_EQ(load_and_count(1, 10), 0u);
}

// A damaged data chunk behind a forged manifest: Fletcher32 fails only on the
// rank that reads the chunk (rank 0 here), yet every rank must refuse.
TEST_F(Checkpoint, DamagedChunkIsRefusedOnEveryRank) {
  const std::string name = "model/wte/weight";
  auto big = make_block(name, {256, 256}, Split::kFirstDim, 1, true);  // the middle of the file is data
  std::vector<TensorSlab> one{big.slab()};
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), one, 3);
  int flipped = 0;
  if (rank() == 0) {
    const std::string file = file_of(1);
    flipped = flip_middle_byte(file);
    const std::string manifest = fs::path(file).parent_path() / "manifest.txt";
    std::ifstream in(manifest);
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    const auto at = s.find("hash mix64-chain ") + std::strlen("hash mix64-chain ");
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(ndmini::io::detail::file_digest(file)));
    s.replace(at, 16, hex);
    std::ofstream(manifest, std::ios::trunc) << s;
  }
  MPI_Bcast(&flipped, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_TRUE(flipped);
  auto into = make_block(name, {256, 256}, Split::kRankZero, 1, false);
  std::vector<TensorSlab> target{into.slab()};
  const std::string msg = error_of([&] { ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, 1, target); });
  EXPECT_TRUE(contains(msg, "corrupted")) << msg;
  EXPECT_TRUE(contains(msg, name)) << msg;
}

TEST_F(Checkpoint, TruncatedFileIsRefused) {
  save(1, 10);
  save(2, 20);
  if (rank() == 0) fs::resize_file(file_of(2), fs::file_size(file_of(2)) / 2);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string msg = error_of([&] { load_and_count(2, 20); });
  EXPECT_TRUE(contains(msg, "truncated")) << msg;
  EXPECT_TRUE(contains(msg, file_of(2))) << msg;
  EXPECT_FALSE(error_of([&] { load_and_count(std::nullopt, 20); }).empty());
  EXPECT_EQ(load_and_count(1, 10), 0u);
}

TEST_F(Checkpoint, MissingCheckpointNamesThePath) {
  EXPECT_FALSE(ndmini::io::latest_step(MPI_COMM_WORLD, root_).has_value());
  std::string msg = error_of([&] { load_and_count(std::nullopt, 10); });
  EXPECT_TRUE(contains(msg, root_)) << msg;
  EXPECT_TRUE(contains(msg, "does not exist")) << msg;

  save(1, 10);
  msg = error_of([&] { load_and_count(5, 10); });
  EXPECT_TRUE(contains(msg, ndmini::io::checkpoint_dirname(5))) << msg;
  EXPECT_TRUE(contains(msg, "--resume")) << msg;

  if (rank() == 0) fs::remove(root_ + "/latest");
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(ndmini::io::latest_step(MPI_COMM_WORLD, root_).has_value());
  msg = error_of([&] { load_and_count(std::nullopt, 10); });
  EXPECT_TRUE(contains(msg, root_)) << msg;
  EXPECT_TRUE(contains(msg, "'latest'")) << msg;
  EXPECT_EQ(load_and_count(1, 10), 0u);  // an explicit step needs no marker
}

TEST_F(Checkpoint, MissingTensorOrWrongShapeIsNamed) {
  save(1, 10);
  auto blocks = make_model(Split::kFirstDim, 10, false);
  blocks.push_back(make_block("model/h/7/mlp/c_fc/weight", {4, 4}, Split::kFirstDim, 0, false));
  std::string msg = error_of([&] { ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, 1, slabs(blocks)); });
  EXPECT_TRUE(contains(msg, "model/h/7/mlp/c_fc/weight")) << msg;

  auto wrong = make_model(Split::kFirstDim, 10, false);
  wrong[0] = make_block("model/h/0/attn/c_attn/weight", {12, 11}, Split::kFirstDim, 0, false);
  msg = error_of([&] { ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, 1, slabs(wrong)); });
  EXPECT_TRUE(contains(msg, "model/h/0/attn/c_attn/weight")) << msg;
  EXPECT_TRUE(contains(msg, "[12, 10]")) << msg;
}

TEST_F(Checkpoint, TooLittleFreeSpaceIsRefusedCleanly) {
  save(1, 10);
  if (rank() == 0) setenv("NDMINI_CKPT_FREE_BYTES", "1000", 1);  // only rank 0 checks
  const std::string msg = error_of([&] { save(2, 20); });
  if (rank() == 0) unsetenv("NDMINI_CKPT_FREE_BYTES");
  EXPECT_TRUE(contains(msg, "free space")) << msg;
  EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), std::optional<std::int64_t>(1));
  if (rank() == 0) {
    EXPECT_FALSE(fs::exists(root_ + "/step_00000002"));
    EXPECT_FALSE(fs::exists(root_ + "/.step_00000002.tmp"));
  }
  EXPECT_EQ(load_and_count(std::nullopt, 10), 0u);
}

// A bad block on one rank only, or blocks that do not cover a tensor exactly
// once, must fail on every rank instead of hanging the others.
TEST_F(Checkpoint, BadBlocksFailOnEveryRank) {
  const int last = nranks() - 1;
  auto blocks = make_model(Split::kFirstDim, 10, true);
  if (rank() == last) blocks[0].offset[0] = 12;  // out of bounds on the last rank only
  std::string msg =
      error_of([&] { ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), slabs(blocks), 3); });
  EXPECT_TRUE(contains(msg, "exceeds shape")) << msg;

  auto twice = make_model(Split::kRankZero, 10, true);
  auto whole = make_block("model/wpe/weight", {3, 4, 5}, Split::kFirstDim, 0, true);
  whole.offset = {0, 0, 0};
  whole.count = {3, 3, 5};  // every rank holds 45 of the 60 elements: 45 or 90 in all
  whole.data.assign(45, 1.0f);
  twice[2] = whole;
  msg = error_of([&] { ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), slabs(twice), 3); });
  EXPECT_TRUE(contains(msg, "model/wpe/weight")) << msg;
  EXPECT_TRUE(contains(msg, "exactly one rank")) << msg;

  if (nranks() > 1) {  // tensor lists that differ between ranks
    auto extra = make_model(Split::kFirstDim, 10, true);
    if (rank() == last) extra.push_back(make_block("model/extra", {2}, Split::kRankZero, 0, true));
    msg = error_of([&] { ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), slabs(extra), 3); });
    EXPECT_TRUE(contains(msg, "different tensor lists")) << msg;
  }
  EXPECT_FALSE(ndmini::io::latest_step(MPI_COMM_WORLD, root_).has_value());
}

}  // namespace
