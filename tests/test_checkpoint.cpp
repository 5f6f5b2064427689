// SPDX-License-Identifier: BSD-3-Clause
// Checkpoints: round trip, resharding, attributes, commit and pruning, and the
// refusal of corrupted, truncated, missing or mismatched checkpoints. Values are
// made from the global index and loaded into zeros, so a no-op load or a block
// read from the wrong place fails. Runs with 1 and 2 ranks (and any other count
// by hand).
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
#include "io/digest.hpp"
#include "io/inspect.hpp"

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
  bool replica = false;

  TensorSlab slab() { return TensorSlab{name, shape, offset, count, data.empty() ? nullptr : data.data(), replica}; }

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

// A block at a given place, filled with the values of `salt` (or zeros).
Block block_at(const std::string& name, std::vector<std::uint64_t> shape, std::vector<std::uint64_t> offset,
               std::vector<std::uint64_t> count, int salt, bool fill, bool replica = false) {
  Block b;
  b.name = name;
  b.shape = std::move(shape);
  b.offset = std::move(offset);
  b.count = std::move(count);
  b.salt = salt;
  b.replica = replica;
  std::uint64_t elements = 1;
  for (auto c : b.count) elements *= c;
  b.data.assign(elements, 0.0f);
  if (fill) b.for_each([&](std::size_t i, std::uint64_t g) { b.data[i] = value(salt, g); });
  return b;
}

// The entry of a rank that holds nothing of a tensor.
Block nothing_of(const std::string& name, std::vector<std::uint64_t> shape) {
  const std::vector<std::uint64_t> zero(shape.size(), 0);
  return block_at(name, std::move(shape), zero, zero, 0, false);
}

// The whole tensor as one block.
Block whole(const std::string& name, std::vector<std::uint64_t> shape, int salt, bool fill, bool replica = false) {
  const std::vector<std::uint64_t> zero(shape.size(), 0);
  return block_at(name, shape, zero, shape, salt, fill, replica);
}

// The flat range [lo, hi) of a [rows, cols] tensor as a flat FSDP shard sees it:
// a partial first row, the full rows, a partial last row (each only if present).
std::vector<Block> flat_range(const std::string& name, std::vector<std::uint64_t> shape, std::uint64_t lo,
                              std::uint64_t hi, int salt, bool fill) {
  const std::uint64_t cols = shape[1];
  std::vector<Block> out;
  auto add = [&](std::uint64_t row, std::uint64_t col, std::uint64_t rows, std::uint64_t n) {
    if (rows > 0 && n > 0) out.push_back(block_at(name, shape, {row, col}, {rows, n}, salt, fill));
  };
  std::uint64_t at = lo;
  if (at % cols != 0) {
    const std::uint64_t end = std::min(hi, (at / cols + 1) * cols);
    add(at / cols, at % cols, 1, end - at);
    at = end;
  }
  const std::uint64_t full = (hi - at) / cols;
  add(at / cols, 0, full, cols);
  at += full * cols;
  if (at < hi) add(at / cols, 0, 1, hi - at);
  return out;
}

// A model whose tensors are cut into pieces dealt round-robin to the ranks,
// piece i to rank (i + shift) % nranks, so that a rank holds several blocks of
// a tensor (none on some ranks) and each rank lists them in descending order.
std::vector<Block> pieces_model(int shift, int salt, bool fill) {
  const int p = nranks();
  auto mine = [&](int piece) { return (piece + shift) % p == rank(); };
  std::vector<Block> out;
  auto add_or_nothing = [&](const std::vector<Block>& blocks, const std::string& name,
                            std::vector<std::uint64_t> shape) {
    if (blocks.empty()) out.push_back(nothing_of(name, std::move(shape)));
    out.insert(out.end(), blocks.begin(), blocks.end());
  };
  // Tensor-parallel-like rows: one block per row of a [6, 5] tensor, plus an
  // empty entry, which may stand next to real blocks.
  const std::string qkv = "model/h/0/attn/c_attn/weight";
  out.push_back(nothing_of(qkv, {6, 5}));
  for (std::uint64_t row = 6; row-- > 0;)
    if (mine(static_cast<int>(row))) out.push_back(block_at(qkv, {6, 5}, {row, 0}, {1, 5}, salt + 1, fill));
  // Flat FSDP-like shards: [7, 23) is a partial row, two full rows and a partial row.
  const std::string wte = "model/wte/weight";
  const std::uint64_t ranges[3][2] = {{7, 23}, {0, 7}, {23, 30}};
  std::vector<Block> blocks;
  for (int i = 0; i < 3; ++i)
    if (mine(i))
      for (auto& b : flat_range(wte, {6, 5}, ranges[i][0], ranges[i][1], salt + 2, fill)) blocks.push_back(b);
  add_or_nothing(blocks, wte, {6, 5});
  // Column stripes, side by side: in the file their rows interleave.
  const std::string fc = "model/h/0/mlp/c_fc/weight";
  blocks.clear();
  for (std::uint64_t j = 3; j-- > 0;)
    if (mine(static_cast<int>(j))) blocks.push_back(block_at(fc, {4, 6}, {0, 2 * j}, {4, 2}, salt + 3, fill));
  add_or_nothing(blocks, fc, {4, 6});
  // Slices along the middle dimension of a 3-D tensor.
  const std::string wpe = "model/wpe/weight";
  blocks.clear();
  for (std::uint64_t k = 4; k-- > 0;)
    if (mine(static_cast<int>(k))) blocks.push_back(block_at(wpe, {3, 4, 5}, {0, k, 0}, {3, 1, 5}, salt + 4, fill));
  add_or_nothing(blocks, wpe, {3, 4, 5});
  // Uneven pieces of a 1-D tensor.
  const std::string bias = "model/h/0/attn/c_attn/bias";
  const std::uint64_t cuts[4] = {0, 3, 4, 10};
  blocks.clear();
  for (int i = 3; i-- > 0;)
    if (mine(i)) blocks.push_back(block_at(bias, {10}, {cuts[i]}, {cuts[i + 1] - cuts[i]}, salt + 5, fill));
  add_or_nothing(blocks, bias, {10});
  return out;
}

// The same tensors (names, shapes, values) with one block per rank.
std::vector<Block> one_block_model(Split split, int salt, bool fill) {
  return {
      make_block("model/h/0/attn/c_attn/weight", {6, 5}, split, salt + 1, fill),
      make_block("model/wte/weight", {6, 5}, split, salt + 2, fill),
      make_block("model/h/0/mlp/c_fc/weight", {4, 6}, split, salt + 3, fill),
      make_block("model/wpe/weight", {3, 4, 5}, split, salt + 4, fill),
      make_block("model/h/0/attn/c_attn/bias", {10}, split, salt + 5, fill),
  };
}

// Number of elements that differ (bitwise) from the values of each block's salt.
std::size_t wrong(const std::vector<Block>& blocks) {
  std::size_t bad = 0;
  for (const Block& b : blocks)
    b.for_each([&](std::size_t i, std::uint64_t g) {
      const float want = value(b.salt, g);
      if (std::memcmp(&b.data[i], &want, sizeof want) != 0) ++bad;
    });
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

  void save_blocks(std::int64_t step, std::vector<Block> blocks) {
    ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(step), slabs(blocks), 3);
  }

  // Loads into the given blocks and returns the number of wrong elements.
  std::size_t load_blocks(std::optional<std::int64_t> step, std::vector<Block> blocks) {
    ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, step, slabs(blocks));
    return wrong(blocks);
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

// The raw-data offset of a dataset, from the manifest of the checkpoint folder.
std::uint64_t extent_of(const std::string& dir, const std::string& dataset) {
  std::ifstream in(dir + "/manifest.txt");
  std::string key, path;
  std::uint64_t offset = 0, bytes = 0;
  while (in >> key) {
    if (key == "extent" && in >> offset >> bytes >> path && path == dataset) return offset;
  }
  return 0;
}

// A damaged byte of raw data passes the manifest (which covers only the
// metadata); the tensor's digest must catch it, on every rank, although only
// rank 0 reads that byte.
TEST_F(Checkpoint, DamagedDataIsRefusedOnEveryRank) {
  const std::string name = "model/wte/weight";
  auto big = make_block(name, {256, 256}, Split::kFirstDim, 1, true);
  std::vector<TensorSlab> one{big.slab()};
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), one, 3);
  int flipped = 0;
  if (rank() == 0) {
    const std::string file = file_of(1);
    const std::uint64_t at = extent_of(fs::path(file).parent_path().string(), "/" + name) + 1000;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(static_cast<std::streamoff>(at));
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x01));  // one bit
    flipped = f.good() && at > 1000;
  }
  MPI_Bcast(&flipped, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_TRUE(flipped);
  auto into = make_block(name, {256, 256}, Split::kRankZero, 1, false);
  std::vector<TensorSlab> target{into.slab()};
  const std::string msg = error_of([&] { ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, 1, target); });
  EXPECT_TRUE(contains(msg, "corrupted")) << msg;
  EXPECT_TRUE(contains(msg, name)) << msg;
  EXPECT_TRUE(contains(msg, "digest")) << msg;
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
  // Valid steps are there: the message lists them and names the way out.
  EXPECT_TRUE(contains(msg, "holds checkpoints of steps 1")) << msg;
  EXPECT_TRUE(contains(msg, "--resume 1")) << msg;
  EXPECT_EQ(load_and_count(1, 10), 0u);  // an explicit step needs no marker

  // A marker of binary garbage is named escaped, never echoed raw.
  if (rank() == 0) std::ofstream(root_ + "/latest", std::ios::binary) << std::string("\x01\xff\x1b[2J", 6);
  MPI_Barrier(MPI_COMM_WORLD);
  msg = error_of([&] { load_and_count(std::nullopt, 10); });
  EXPECT_TRUE(contains(msg, "\\x01\\xff\\x1b[2J")) << msg;
  EXPECT_FALSE(contains(msg, "\x1b")) << msg;
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
  EXPECT_TRUE(contains(msg, "1000 bytes are free")) << msg;
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

// Several blocks per rank (rows, flat shards, column stripes, slices), saved
// and loaded into other multi-block and single-block layouts.
TEST_F(Checkpoint, SeveralBlocksPerRankRoundTripAndReshard) {
  save_blocks(1, pieces_model(0, 10, true));
  EXPECT_EQ(load_blocks(1, pieces_model(0, 10, false)), 0u);
  EXPECT_EQ(load_blocks(1, pieces_model(1, 10, false)), 0u);  // the pieces dealt to other ranks
  for (Split split : {Split::kFirstDim, Split::kLastDim, Split::kRankZero})
    EXPECT_EQ(load_blocks(1, one_block_model(split, 10, false)), 0u);
  EXPECT_GT(load_blocks(1, pieces_model(0, 20, false)), 0u);  // negative control

  save_blocks(2, one_block_model(Split::kRankZero, 30, true));
  EXPECT_EQ(load_blocks(2, pieces_model(0, 30, false)), 0u);
  EXPECT_EQ(load_blocks(2, pieces_model(1, 30, false)), 0u);
  save_blocks(3, one_block_model(Split::kLastDim, 40, true));
  EXPECT_EQ(load_blocks(3, pieces_model(1, 40, false)), 0u);
}

// Rank 0's blocks out of order, some side by side in a row and of different
// widths: the staging order must follow the file, not the list.
TEST_F(Checkpoint, UnsortedInterleavedBlocks) {
  const std::string name = "model/h/0/attn/c_proj/weight";
  auto pattern = [&](int salt, bool fill) {
    if (rank() != 0) return std::vector<Block>{nothing_of(name, {4, 5})};
    return std::vector<Block>{
        block_at(name, {4, 5}, {3, 0}, {1, 5}, salt, fill), block_at(name, {4, 5}, {0, 3}, {2, 2}, salt, fill),
        block_at(name, {4, 5}, {2, 1}, {1, 4}, salt, fill), block_at(name, {4, 5}, {0, 0}, {2, 3}, salt, fill),
        block_at(name, {4, 5}, {2, 0}, {1, 1}, salt, fill),
    };
  };
  save_blocks(1, pattern(7, true));
  EXPECT_EQ(load_blocks(1, pattern(7, false)), 0u);
  EXPECT_EQ(load_blocks(1, {make_block(name, {4, 5}, Split::kFirstDim, 7, false)}), 0u);
  EXPECT_EQ(load_blocks(1, {make_block(name, {4, 5}, Split::kLastDim, 7, false)}), 0u);
  save_blocks(2, {make_block(name, {4, 5}, Split::kLastDim, 8, true)});
  EXPECT_EQ(load_blocks(2, pattern(8, false)), 0u);
}

// Every rank holds the whole tensors; only rank 0 owns them. Replica blocks are
// not written (their data here is garbage) but are read, and the digests match.
TEST_F(Checkpoint, ReplicasAreReadButNotWritten) {
  const std::string w = "model/h/0/attn/c_proj/weight", ln = "model/h/0/ln_1/weight";
  const bool copy = rank() != 0;
  std::vector<Block> saved{whole(w, {6, 5}, 1, true, copy), whole(ln, {8}, 2, true, copy)};
  if (copy)
    for (auto& b : saved) std::fill(b.data.begin(), b.data.end(), -1.0f);
  save_blocks(1, saved);
  EXPECT_EQ(load_blocks(1, {whole(w, {6, 5}, 1, false, copy), whole(ln, {8}, 2, false, copy)}), 0u);

  // Each rank owns a shard and holds the rest as replica blocks.
  const std::uint64_t r = rank(), p = nranks();
  std::vector<Block> mixed;
  auto shard = [&](const std::string& name, std::vector<std::uint64_t> shape, int salt) {
    const std::uint64_t n = shape[0], lo = r * n / p, hi = (r + 1) * n / p;
    auto rows = [&](std::uint64_t a, std::uint64_t b, bool replica) {
      if (a == b) return;
      std::vector<std::uint64_t> offset(shape.size(), 0), count = shape;
      offset[0] = a;
      count[0] = b - a;
      mixed.push_back(block_at(name, shape, offset, count, salt, false, replica));
    };
    rows(hi, n, true);
    rows(lo, hi, false);
    rows(0, lo, true);
  };
  shard(w, {6, 5}, 1);
  shard(ln, {8}, 2);
  EXPECT_EQ(load_blocks(1, mixed), 0u);

  EXPECT_EQ(load_blocks(
                1, {make_block(w, {6, 5}, Split::kLastDim, 1, false), make_block(ln, {8}, Split::kFirstDim, 2, false)}),
            0u);
}

TEST_F(Checkpoint, LoadWithoutAnOwnerFailsOnEveryRank) {
  const std::string w = "model/h/0/attn/c_proj/weight";
  save_blocks(1, {make_block(w, {6, 5}, Split::kFirstDim, 1, true)});
  // Every copy marked replica: nobody owns the tensor.
  std::string msg = error_of([&] { load_blocks(1, {whole(w, {6, 5}, 1, false, true)}); });
  EXPECT_TRUE(contains(msg, w)) << msg;
  EXPECT_TRUE(contains(msg, "exactly one rank")) << msg;
  // Rank 0 owns it and every other rank holds a replica; the last rank lists
  // one row twice, which only it can see.
  std::vector<Block> twice{whole(w, {6, 5}, 1, false, rank() != 0)};
  if (rank() == nranks() - 1) twice.push_back(block_at(w, {6, 5}, {2, 0}, {1, 5}, 1, false, true));
  msg = error_of([&] { load_blocks(1, twice); });
  EXPECT_TRUE(contains(msg, w)) << msg;
  EXPECT_TRUE(contains(msg, "overlap")) << msg;
  EXPECT_EQ(load_blocks(1, {whole(w, {6, 5}, 1, false, rank() != 0)}), 0u);  // still loads
}

// Mistakes in one rank's block list fail on every rank, and nothing is saved.
TEST_F(Checkpoint, BadBlockListsFailOnEveryRank) {
  const std::string w = "model/h/0/attn/c_proj/weight";
  const bool last = rank() == nranks() - 1;
  std::vector<Block> overlap{make_block(w, {6, 5}, Split::kFirstDim, 1, true)};
  if (last) {  // two blocks over the same element; the count check alone would not see it
    overlap[0] = block_at(w, {6, 5}, {5, 0}, {1, 3}, 1, true);
    overlap.push_back(block_at(w, {6, 5}, {5, 2}, {1, 3}, 1, true));
  }
  std::string msg = error_of([&] { save_blocks(1, overlap); });
  EXPECT_TRUE(contains(msg, "overlap")) << msg;

  std::vector<Block> shapes{make_block(w, {6, 5}, Split::kFirstDim, 1, true)};
  if (last) shapes.push_back(nothing_of(w, {5, 6}));
  msg = error_of([&] { save_blocks(1, shapes); });
  EXPECT_TRUE(contains(msg, "listed with shapes")) << msg;
  EXPECT_FALSE(ndmini::io::latest_step(MPI_COMM_WORLD, root_).has_value());
}

// Free space is never rounded up in the message (1.95 MiB is "1.9 MiB").
TEST_F(Checkpoint, FreeSpaceIsNotRoundedUp) {
  if (rank() == 0) setenv("NDMINI_CKPT_FREE_BYTES", "2044723", 1);
  const std::string msg = error_of([&] {
    auto big = make_block("model/wte/weight", {1024, 512}, Split::kFirstDim, 1, true);
    ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), {big.slab()}, 3);
  });
  if (rank() == 0) unsetenv("NDMINI_CKPT_FREE_BYTES");
  EXPECT_TRUE(contains(msg, ", 1.9 MiB are free")) << msg;
  EXPECT_TRUE(contains(msg, "it needs about 3.1 MiB")) << msg;  // 3.008 MiB (data, metadata, margin), rounded up
}

// A failure in any phase of a save, on any rank (what a full disk or a failed
// sync does there), reaches every rank as one error naming the phase and the
// rank; the save is undone: no temporary folder, no new step, `latest` and
// the previous checkpoint as they were. Also when the save replaces a step.
TEST_F(Checkpoint, FailureInAnyPhaseOnAnyRankIsUndone) {
  using ndmini::SavePhase;
  save(1, 10);
  save(2, 20);
  for (SavePhase phase :
       {SavePhase::create, SavePhase::write, SavePhase::close, SavePhase::rename, SavePhase::latest}) {
    for (int victim = 0; victim < nranks(); ++victim) {
      for (std::int64_t step : {3, 2}) {  // a new step, and a step that exists (a resumed run saving it again)
        const std::string tag =
            std::string(ndmini::name_of(phase)) + " rank " + std::to_string(victim) + " step " + std::to_string(step);
        int fired = 0;
        ndmini::io::SaveOptions options;
        options.hook = [&](SavePhase p, std::int64_t s, const std::string& file) {
          if (p != phase || rank() != victim) return;
          fired = s == step && contains(file, ".step_0000000" + std::to_string(step) + ".tmp/checkpoint.h5");
          throw ndmini::Error("'" + file + "': No space left on device (test)");
        };
        auto blocks = make_model(Split::kFirstDim, 99, true);
        const std::string msg = error_of(
            [&] { ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(step), slabs(blocks), 3, options); });
        int fired_anywhere = 0;
        MPI_Allreduce(&fired, &fired_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        EXPECT_EQ(fired_anywhere, 1) << tag;
        EXPECT_TRUE(contains(
            msg, "failed in phase '" + std::string(ndmini::name_of(phase)) + "' on rank " + std::to_string(victim)))
            << tag << ": " << msg;
        EXPECT_TRUE(contains(msg, "No space left on device")) << tag << ": " << msg;
        EXPECT_TRUE(contains(msg, "'latest' still names step 2")) << tag << ": " << msg;
        EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), std::optional<std::int64_t>(2)) << tag;
        if (rank() == 0) {
          std::vector<std::string> names;
          for (const auto& e : fs::directory_iterator(root_)) names.push_back(e.path().filename().string());
          std::sort(names.begin(), names.end());
          EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000001", "step_00000002"})) << tag;
        }
        EXPECT_EQ(load_and_count(2, 20), 0u) << tag;  // the previous step 2, not the failed one
      }
    }
  }
  EXPECT_EQ(load_and_count(1, 10), 0u);
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// checkpoint.async: the state written by a background thread, committed by
// finish(), is byte for byte the checkpoint a sync save of it writes (both
// files of the folder), loads back, and until finish() `latest` is unchanged.
// While the thread writes, this thread keeps calling MPI (as training does).
TEST_F(Checkpoint, AsyncSaveIsByteIdenticalToSync) {
  const std::string sync_root = dir_ + "/sync";
  for (Split split : {Split::kFirstDim, Split::kLastDim}) {
    const int salt = split == Split::kFirstDim ? 10 : 40;
    const std::int64_t step = salt;
    auto blocks = make_model(split, salt, true);
    ndmini::io::save_checkpoint(MPI_COMM_WORLD, sync_root, info_for(step), slabs(blocks), 3);
    save(1, 5);
    const auto before = ndmini::io::latest_step(MPI_COMM_WORLD, root_);
    auto async_slabs = slabs(blocks);
    ndmini::io::AsyncSave pending(MPI_COMM_WORLD, root_, info_for(step), async_slabs, 3);
    EXPECT_EQ(pending.step(), step);
    for (int i = 0; i < 20 && !pending.written_everywhere(); ++i) MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), before);  // not committed before finish()
    EXPECT_GE(pending.finish(), 0.0);
    EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), std::optional<std::int64_t>(step));
    if (rank() == 0) {
      for (const char* name : {"checkpoint.h5", "manifest.txt"}) {
        const std::string dirname = "/" + ndmini::io::checkpoint_dirname(step) + "/" + name;
        const std::string a = file_bytes(sync_root + dirname), b = file_bytes(root_ + dirname);
        EXPECT_FALSE(a.empty()) << name;
        EXPECT_TRUE(a == b) << name << " differs between the sync and the async save";
      }
    }
    EXPECT_EQ(load_and_count(step, salt, Split::kMiddleDim), 0u);
  }
}

// An async save's prune renames the checkpoints it drops aside, so the
// commit does not wait for their blocks to be freed; a thread of rank 0
// removes them, and once the AsyncSave is gone the folder holds what a sync
// save with the same keep leaves (here keep 1: the new step and `latest`).
TEST_F(Checkpoint, AsyncSavePrunesInTheBackground) {
  save(1, 10, Split::kFirstDim, 1);
  save(2, 20, Split::kFirstDim, 2);  // two steps on disk, one of them dropped below
  if (rank() == 0) fs::create_directories(root_ + "/.step_00000001.pruned");  // left by a run that died
  MPI_Barrier(MPI_COMM_WORLD);
  auto blocks = make_model(Split::kFirstDim, 30, true);
  auto async_slabs = slabs(blocks);
  {
    ndmini::io::AsyncSave pending(MPI_COMM_WORLD, root_, info_for(3), async_slabs, 1);
    pending.finish();
    EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), std::optional<std::int64_t>(3));
    if (rank() == 0) {  // committed steps are gone from the listing at once
      EXPECT_FALSE(fs::exists(root_ + "/step_00000001"));
      EXPECT_FALSE(fs::exists(root_ + "/step_00000002"));
    }
  }
  if (rank() == 0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000003"}));
  }
  EXPECT_EQ(load_and_count(3, 30), 0u);
}

// An async save's failure in its background phases (write, close) or in
// those finish() runs, on any rank, reaches every rank from finish() as a
// sync save's would, and is undone the same way.
TEST_F(Checkpoint, AsyncSaveFailureIsReportedAndUndone) {
  using ndmini::SavePhase;
  save(2, 20);
  for (SavePhase phase : {SavePhase::write, SavePhase::close, SavePhase::rename, SavePhase::latest}) {
    for (int victim = 0; victim < nranks(); ++victim) {
      const std::string tag = std::string(ndmini::name_of(phase)) + " rank " + std::to_string(victim);
      ndmini::io::SaveOptions options;
      options.hook = [&](SavePhase p, std::int64_t, const std::string& file) {
        if (p == phase && rank() == victim) throw ndmini::Error("'" + file + "': No space left on device (test)");
      };
      auto blocks = make_model(Split::kFirstDim, 99, true);
      auto async_slabs = slabs(blocks);
      ndmini::io::AsyncSave pending(MPI_COMM_WORLD, root_, info_for(3), async_slabs, 3, options);
      const std::string msg = error_of([&] { pending.finish(); });
      EXPECT_TRUE(contains(
          msg, "failed in phase '" + std::string(ndmini::name_of(phase)) + "' on rank " + std::to_string(victim)))
          << tag << ": " << msg;
      EXPECT_TRUE(contains(msg, "'latest' still names step 2")) << tag << ": " << msg;
      EXPECT_EQ(ndmini::io::latest_step(MPI_COMM_WORLD, root_), std::optional<std::int64_t>(2)) << tag;
      if (rank() == 0) EXPECT_FALSE(fs::exists(root_ + "/.step_00000003.tmp")) << tag;
    }
  }
  EXPECT_EQ(load_and_count(2, 20), 0u);
}

// The save reports its time split, the same on every rank.
TEST_F(Checkpoint, SaveTimesAreReported) {
  ndmini::io::SaveTimes times;
  ndmini::io::SaveOptions options;
  options.times = &times;
  auto blocks = make_model(Split::kFirstDim, 10, true);
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), slabs(blocks), 3, options);
  EXPECT_GT(times.total, 0);
  EXPECT_GE(times.total, times.create + times.write + times.commit);
  double lo = times.total, hi = times.total;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

TEST_F(Checkpoint, DataProvenanceRoundTrips) {
  CheckpointInfo info = info_for(1);
  info.data = {"tokens", "data/train.bin", 123456789, "0123456789abcdef"};
  auto blocks = make_model(Split::kFirstDim, 10, true);
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info, slabs(blocks), 3);
  auto zeros = make_model(Split::kLastDim, 10, false);
  const CheckpointInfo got = ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, std::nullopt, slabs(zeros));
  EXPECT_EQ(got.data.kind, "tokens");
  EXPECT_EQ(got.data.path, "data/train.bin");
  EXPECT_EQ(got.data.bytes, 123456789u);
  EXPECT_EQ(got.data.digest, "0123456789abcdef");
  if (rank() == 0) {
    const std::string text = ndmini::io::describe_checkpoint(root_ + "/step_00000001");
    for (const char* want : {"data_source      tokens\n", "data_path        data/train.bin\n",
                             "data_bytes       123456789\n", "data_digest      0123456789abcdef\n"})
      EXPECT_TRUE(contains(text, want)) << want << " not in:\n" << text;
  }
}

// One writer per folder: a second lock on it, writer or reader, is refused at
// once, naming the folder and the holder; readers share it; released, it can
// be taken again. A writer proves the folder usable up front and clears
// debris of dead saves.
TEST_F(Checkpoint, DirLockAdmitsOneWriterOrManyReaders) {
  using ndmini::io::CheckpointDirLock;
  using ndmini::io::DirAccess;
  auto first = std::make_unique<CheckpointDirLock>(MPI_COMM_WORLD, root_, DirAccess::write);
  long long holder = ::getpid();  // rank 0 holds the lock for the job
  MPI_Bcast(&holder, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  if (rank() == 0) fs::create_directories(root_ + "/.step_00000007.tmp");
  for (DirAccess second : {DirAccess::write, DirAccess::read}) {
    const std::string msg = error_of([&] { CheckpointDirLock again(MPI_COMM_WORLD, root_, second); });
    EXPECT_TRUE(contains(msg, "checkpoint.dir = '" + root_ + "' is in use by another job")) << msg;
    EXPECT_TRUE(contains(msg, "pid " + std::to_string(holder))) << msg;
  }
  first.reset();
  {
    // Readers share it (one job per rank, as several jobs would), and keep a writer out.
    CheckpointDirLock reader(MPI_COMM_SELF, root_, DirAccess::read);
    CheckpointDirLock other_reader(MPI_COMM_WORLD, root_, DirAccess::read);
    const std::string msg = error_of([&] { CheckpointDirLock writer(MPI_COMM_WORLD, root_, DirAccess::write); });
    EXPECT_TRUE(contains(msg, "is in use by another job")) << msg;
    EXPECT_TRUE(contains(msg, ", reading)")) << msg;
    if (rank() == 0) EXPECT_TRUE(fs::exists(root_ + "/.step_00000007.tmp"));  // readers touch nothing
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's own reader is gone
  {
    CheckpointDirLock again(MPI_COMM_WORLD, root_, DirAccess::write);
    if (rank() == 0) EXPECT_FALSE(fs::exists(root_ + "/.step_00000007.tmp"));
  }
  EXPECT_NO_THROW(CheckpointDirLock(MPI_COMM_WORLD, dir_ + "/absent", DirAccess::read));  // the load will say so
  if (rank() == 0) std::ofstream(dir_ + "/a_file") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  std::string msg = error_of([&] { CheckpointDirLock bad(MPI_COMM_WORLD, dir_ + "/a_file", DirAccess::write); });
  EXPECT_TRUE(contains(msg, "is not a folder")) << msg;
  msg = error_of([&] { CheckpointDirLock bad(MPI_COMM_WORLD, dir_ + "/a_file/sub", DirAccess::write); });
  EXPECT_TRUE(contains(msg, "cannot be created")) << msg;
  if (rank() == 0) setenv("NDMINI_CKPT_FREE_BYTES", "1000", 1);
  msg = error_of([&] { CheckpointDirLock tight(MPI_COMM_WORLD, root_, DirAccess::write, 5000000); });
  if (rank() == 0) unsetenv("NDMINI_CKPT_FREE_BYTES");
  EXPECT_TRUE(contains(msg, "not enough free space in '" + root_ + "' for one checkpoint of this model")) << msg;
}

// Every kind of damage to a committed checkpoint is refused on load, by every
// rank, with a message naming the file (or the marker), and `ndmini ckpt
// verify` reports it too: single bit flips at 60 places spread over the whole
// file (metadata, alignment gaps and raw data alike), truncations, an
// extension, an empty or missing file, a missing, edited or forged manifest,
// and bad `latest` markers. A good copy loads after each.
TEST_F(Checkpoint, EveryCorruptionIsRefused) {
  // Enough raw data that flips land in data as well as metadata.
  std::vector<Block> model = make_model(Split::kFirstDim, 10, true);
  model.push_back(make_block("model/wte/weight", {64, 96}, Split::kLastDim, 20, true));
  ndmini::io::save_checkpoint(MPI_COMM_WORLD, root_, info_for(1), slabs(model), 3);
  const std::string good = dir_ + "/good";
  if (rank() == 0) fs::copy(root_, good, fs::copy_options::recursive);
  const std::string step_dir = root_ + "/step_00000001", file = step_dir + "/checkpoint.h5",
                    manifest = step_dir + "/manifest.txt";
  std::uint64_t size = 0;
  if (rank() == 0) size = fs::file_size(file);
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);

  auto restore = [&] {
    if (rank() == 0) {
      fs::remove_all(root_);
      fs::copy(good, root_, fs::copy_options::recursive);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  };
  auto read_text = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  struct Case {
    std::string name;
    std::function<void()> damage;  // run on rank 0
    std::string want;              // in the load's message
  };
  std::vector<Case> cases;
  constexpr int kFlips = 60;
  for (int i = 0; i < kFlips; ++i) {
    const std::uint64_t at = (size - 1) * i / (kFlips - 1);
    cases.push_back({"bit flip at byte " + std::to_string(at),
                     [&, at] {
                       std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
                       char c = 0;
                       f.seekg(static_cast<std::streamoff>(at));
                       f.get(c);
                       f.seekp(static_cast<std::streamoff>(at));
                       f.put(static_cast<char>(c ^ (1 << (i % 8))));
                     },
                     "corrupted"});
  }
  cases.push_back({"truncated to half", [&] { fs::resize_file(file, size / 2); }, "truncated"});
  cases.push_back({"last byte cut", [&] { fs::resize_file(file, size - 1); }, "truncated"});
  cases.push_back({"one byte appended", [&] { fs::resize_file(file, size + 1); }, "truncated"});
  cases.push_back({"empty file", [&] { fs::resize_file(file, 0); }, "truncated"});
  cases.push_back({"file deleted", [&] { fs::remove(file); }, "the file is missing"});
  cases.push_back({"manifest deleted", [&] { fs::remove(manifest); }, "no manifest.txt"});
  cases.push_back({"manifest emptied", [&] { fs::resize_file(manifest, 0); }, "not an ndmini manifest"});
  cases.push_back({"manifest size edited",
                   [&] {
                     std::string t = read_text(manifest);
                     const auto at = t.find("size ") + 5;
                     t[at] = t[at] == '9' ? '8' : '9';
                     std::ofstream(manifest, std::ios::binary | std::ios::trunc) << t;
                   },
                   "its own hash does not match"});
  cases.push_back({"manifest forged (metadata hash changed, its own hash recomputed)",
                   [&] {
                     std::string t = read_text(manifest);
                     const auto at = t.find("metadata ") + 9;
                     t[at] = t[at] == '0' ? '1' : '0';
                     t.erase(t.rfind("manifest "));
                     t += "manifest " + ndmini::io::hex64(ndmini::io::hash_bytes(t.data(), t.size())) + "\n";
                     std::ofstream(manifest, std::ios::binary | std::ios::trunc) << t;
                   },
                   "metadata hash"});
  cases.push_back({"manifest forged (an extent moved, its own hash recomputed)",
                   [&] {
                     std::string t = read_text(manifest);
                     const auto line = t.find("extent ");
                     t.replace(line + 7, 1, std::string(1, t[line + 7] == '9' ? '8' : t[line + 7] + 1));
                     t.erase(t.rfind("manifest "));
                     t += "manifest " + ndmini::io::hex64(ndmini::io::hash_bytes(t.data(), t.size())) + "\n";
                     std::ofstream(manifest, std::ios::binary | std::ios::trunc) << t;
                   },
                   "corrupted"});
  cases.push_back({"manifest of another format",
                   [&] { std::ofstream(manifest, std::ios::trunc) << "ndmini-checkpoint-manifest 1\nfile x\n"; },
                   "is in format 1"});
  cases.push_back({"latest names a missing step", [&] { std::ofstream(root_ + "/latest", std::ios::trunc) << "7\n"; },
                   "names step 7"});
  cases.push_back(
      {"latest empty", [&] { std::ofstream(root_ + "/latest", std::ios::trunc); }, "does not hold a step number"});
  cases.push_back(
      {"latest garbage",
       [&] { std::ofstream(root_ + "/latest", std::ios::trunc | std::ios::binary) << std::string("1\0x", 3); },
       "does not hold a step number"});
  ASSERT_EQ(cases.size(), 74u);

  int refused = 0, verified_bad = 0, marker_cases = 0;
  for (const Case& c : cases) {
    restore();
    if (rank() == 0) c.damage();
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<Block> into = make_model(Split::kLastDim, 10, false);
    into.push_back(make_block("model/wte/weight", {64, 96}, Split::kFirstDim, 20, false));
    const std::string msg =
        error_of([&] { ndmini::io::load_checkpoint(MPI_COMM_WORLD, root_, std::nullopt, slabs(into)); });
    // The same refusal on every rank.
    int failed = !msg.empty(), everywhere = 0;
    MPI_Allreduce(&failed, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_TRUE(everywhere) << c.name << ": loaded without an error";
    EXPECT_TRUE(contains(msg, c.want)) << c.name << ": " << msg;
    const bool marker = contains(c.name, "latest");
    EXPECT_TRUE(contains(msg, marker ? root_ : file)) << c.name << ": " << msg;
    refused += everywhere && contains(msg, c.want);
    if (rank() == 0 && !marker) {
      verified_bad += !ndmini::io::verify_checkpoint(step_dir).problems.empty();
    }
    marker_cases += marker;
  }
  MPI_Bcast(&verified_bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(refused, 74);
  EXPECT_EQ(verified_bad, 74 - marker_cases);
  restore();
  EXPECT_EQ(load_and_count(std::nullopt, 10), 0u);  // the negative control: the good copy loads
  if (rank() == 0) EXPECT_TRUE(ndmini::io::verify_checkpoint(step_dir).problems.empty());
}

}  // namespace
