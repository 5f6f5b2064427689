// SPDX-License-Identifier: BSD-3-Clause
// The mesh: rank <-> coordinate arithmetic, the resolution and validation of a
// run's layout (the mesh's own rules and the model's, pipeline's and batch's
// checked with it: every refusal with its message), and, on the real world
// size, every factorization over the five axes built with MPI and checked
// against the coordinates: axis sizes, tp on consecutive ranks, group
// membership (fsdp, batch, norm, the tied-embedding pair).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "core/error.hpp"
#include "mesh/mesh.hpp"
#include "run/layout.hpp"

using namespace ndmini;

namespace {

using Coords = std::array<int, kNumAxes>;

ParallelDims shape_of(int pp, int dp_replicate, int dp_shard, int cp, int tp) {
  return ParallelDims::from_degrees({pp, dp_replicate, dp_shard, cp, tp});
}

// A model every small tp divides: heads 8, 4C = 256, vocab 512.
Config config_with(const std::vector<std::string>& overrides) {
  const char* deck = R"(
[model]
layers = 2
channels = 64
heads = 8
vocab = 512
seq_len = 32

[train]
global_batch = 64
micro_batch = 2
)";
  return parse_config(deck, "deck.toml", overrides);
}

std::string resolve_error(const std::vector<std::string>& overrides, int world) {
  try {
    resolve_layout(config_with(overrides), world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const std::vector<std::string>& overrides, int world, const std::vector<std::string>& parts) {
  const std::string msg = resolve_error(overrides, world);
  ASSERT_FALSE(msg.empty()) << "expected resolve_layout to refuse world " << world;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Waits for a non-blocking collective, sleeping 50 us between tests: with
// more ranks than cores (8 on 2) MPI's blocking wait spins away the time
// slice the rank it waits for needs, some 30 ms a call instead of 1 (the
// comm layer naps so too: waits_share_cores in src/comm/ledger.hpp).
void nap_wait(MPI_Request& request) {
  int done = 0;
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

int all_reduce(int v, MPI_Op op, MPI_Comm comm) {
  int out = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(&v, &out, 1, MPI_INT, op, comm, &request);
  nap_wait(request);
  return out;
}

// The world ranks of `comm`'s members, in comm-rank order.
std::vector<int> members(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> out(n);
  const int me = world_rank();
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, comm, &request);
  nap_wait(request);
  return out;
}

// The world ranks sharing this rank's coordinates outside `keep`, ascending.
std::vector<int> expected_group(const ParallelDims& s, const Coords& mine, std::initializer_list<Axis> keep) {
  std::vector<int> out;
  for (int r = 0; r < s.size(); ++r) {
    const Coords c = s.coords_of(r);
    bool same = true;
    for (int i = 0; i < kNumAxes; ++i) {
      const bool kept = std::find(keep.begin(), keep.end(), static_cast<Axis>(i)) != keep.end();
      if (!kept && c[i] != mine[i]) same = false;
    }
    if (same) out.push_back(r);
  }
  return out;
}

int sum_over(MPI_Comm comm, int v) { return all_reduce(v, MPI_SUM, comm); }

}  // namespace

TEST(ParallelDims, CoordsRoundTripTpFastest) {
  const ParallelDims s = shape_of(2, 3, 2, 1, 4);
  ASSERT_EQ(s.size(), 48);
  for (int r = 0; r < s.size(); ++r) EXPECT_EQ(s.rank_of(s.coords_of(r)), r);
  EXPECT_EQ(s.coords_of(1), (Coords{0, 0, 0, 0, 1}));   // tp varies fastest
  EXPECT_EQ(s.coords_of(4), (Coords{0, 0, 1, 0, 0}));   // then dp_shard
  EXPECT_EQ(s.coords_of(8), (Coords{0, 1, 0, 0, 0}));   // then dp_replicate
  EXPECT_EQ(s.coords_of(24), (Coords{1, 0, 0, 0, 0}));  // pp outermost
  EXPECT_EQ(s.str(), "pp=2 dp_replicate=3 dp_shard=2 cp=1 tp=4");
  EXPECT_STREQ(axis_name(Axis::dp_shard), "dp_shard");
}

ParallelDims resolve(const std::vector<std::string>& overrides, int world) {
  return resolve_layout(config_with(overrides), world).dims;
}

TEST(ResolveMesh, DefaultsToOneRank) {
  const ParallelDims s = resolve({}, 1);
  EXPECT_EQ(s.size(), 1);
}

TEST(ResolveMesh, MinusOneTakesWhatIsLeft) {
  const ParallelDims s = resolve({"parallel.tp=2", "parallel.dp_replicate=-1"}, 8);
  EXPECT_EQ(s.degree_of(Axis::dp_replicate), 4);
  EXPECT_EQ(s.degree_of(Axis::tp), 2);
  EXPECT_EQ(s.size(), 8);
  const ParallelDims t = resolve({"parallel.tp=-1", "parallel.dp_shard=2"}, 8);
  EXPECT_EQ(t.degree_of(Axis::tp), 4);
  const ParallelDims one = resolve({"parallel.cp=-1"}, 1);  // resolves to 1
  EXPECT_EQ(one.degree_of(Axis::cp), 1);
  const ParallelDims pp = resolve({"parallel.pp=-1", "parallel.cp=2"}, 4);
  EXPECT_EQ(pp.degree_of(Axis::pp), 2);
}

// The layout holds the degrees once, with the split the deck asks for, and
// the stage plan and schedule built from them.
TEST(ResolveLayout, OneValueForTheDegreesAndThePipeline) {
  const RunLayout l = resolve_layout(
      config_with({"model.layers=4", "parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                   "parallel.virtual_stages=2", "parallel.schedule=\"interleaved_1f1b\"", "parallel.dp_shard=-1"}),
      8);
  EXPECT_EQ(l.dims.pp, 2);
  EXPECT_EQ(l.dims.dp_shard, 2);
  EXPECT_TRUE(l.dims.sequence_parallel);
  EXPECT_EQ(l.dims.virtual_stages, 2);
  EXPECT_TRUE(l.dims.enabled(Axis::pp));
  EXPECT_FALSE(l.dims.enabled(Axis::cp));
  EXPECT_EQ(l.plan.pp(), l.dims.pp);
  EXPECT_EQ(l.plan.virtual_stages(), l.dims.virtual_stages);
  EXPECT_EQ(l.schedule.kind(), ScheduleKind::interleaved);
  EXPECT_EQ(l.schedule.micro_batches(), l.micro_batches);
  // One rank: no pipeline, whatever the deck's schedule.
  const RunLayout one = resolve_layout(config_with({}), 1);
  EXPECT_EQ(one.schedule.kind(), ScheduleKind::none);
  EXPECT_EQ(one.plan.chunks(), 1);
}

TEST(ResolveMesh, RefusesTwoMinusOnes) {
  expect_refused({"parallel.tp=-1", "parallel.dp_shard=-1"}, 4,
                 {"parallel.dp_shard and parallel.tp are both -1", "at most one"});
  // Every pair, whatever the world: no -1 is resolved before the count is checked.
  const std::vector<std::string> keys = {"dp_replicate", "dp_shard", "tp", "cp", "pp"};
  for (std::size_t a = 0; a < keys.size(); ++a)
    for (std::size_t b = a + 1; b < keys.size(); ++b)
      for (int world : {1, 4, 8})
        expect_refused({"parallel." + keys[a] + "=-1", "parallel." + keys[b] + "=-1"}, world,
                       {"are both -1", "at most one degree may be -1"});
}

// Settings that do nothing in the resolved layout are noted, not refused.
TEST(ResolveLayout, NotesSettingsWithoutEffect) {
  auto notes = [](const std::vector<std::string>& overrides, int world) {
    const Config cfg = config_with(overrides);
    return settings_without_effect(cfg, resolve_layout(cfg, world));
  };
  EXPECT_TRUE(notes({}, 1).empty());
  auto expect_one = [](const std::vector<std::string>& got, const std::string& part) {
    ASSERT_EQ(got.size(), 1u);
    EXPECT_NE(got[0].find(part), std::string::npos) << "'" << part << "' not in: " << got[0];
  };
  expect_one(notes({"parallel.schedule=\"interleaved_1f1b\""}, 1),
             "parallel.schedule = \"interleaved_1f1b\" has no effect with parallel.pp = 1");
  expect_one(notes({"parallel.schedule=\"gpipe\"", "parallel.pp=-1"}, 1), "has no effect with parallel.pp = 1");
  EXPECT_TRUE(notes({"parallel.schedule=\"gpipe\"", "parallel.pp=2"}, 2).empty());
  expect_one(notes({"parallel.sequence_parallel=true"}, 1),
             "parallel.sequence_parallel = true has no effect with parallel.tp = 1");
  expect_one(notes({"parallel.sequence_parallel=true", "parallel.tp=-1", "parallel.dp_shard=2"}, 2),
             "has no effect with parallel.tp = 1");
  EXPECT_TRUE(notes({"parallel.sequence_parallel=true", "parallel.tp=2"}, 2).empty());
  expect_one(notes({"train.steps=3", "train.warmup_steps=4"}, 1),
             "train.warmup_steps = 4 exceeds train.steps = 3: the run ends in warm-up, at 75% of train.lr");
  EXPECT_TRUE(notes({"train.steps=4", "train.warmup_steps=4"}, 1).empty());  // the last step reaches train.lr
  EXPECT_TRUE(notes({"train.steps=0", "train.warmup_steps=4"}, 1).empty());  // no step, nothing to warm up
  EXPECT_EQ(notes({"parallel.schedule=\"gpipe\"", "parallel.sequence_parallel=true", "train.steps=1"}, 1).size(), 3u);
}

TEST(ResolveMesh, RefusesMinusOneThatDoesNotDivide) {
  expect_refused({"parallel.tp=2", "parallel.dp_replicate=-1"}, 3,
                 {"parallel.dp_replicate = -1 cannot be resolved", "multiply to 2", "3 ranks"});
}

TEST(ResolveMesh, RefusesWrongProduct) {
  expect_refused({"parallel.tp=2", "parallel.dp_replicate=2", "parallel.dp_shard=1"}, 3,
                 {"parallel: dp_replicate=2 x dp_shard=1 x tp=2 x cp=1 x pp=1 = 4 ranks, but the job has 3",
                  "launch 4 ranks (mpiexec -n 4)"});
  // Where the other degrees divide the world, the refusal names the -1 that fills it.
  expect_refused(
      {"parallel.tp=2", "parallel.dp_shard=1"}, 4,
      {"= 2 ranks, but the job has 4",
       "or set parallel.dp_shard = -1 (--set parallel.dp_shard=-1) to fill the job with FSDP (dp_shard = 2)"});
  const std::string no_fill = resolve_error({"parallel.tp=2", "parallel.dp_replicate=2", "parallel.dp_shard=1"}, 3);
  EXPECT_EQ(no_fill.find("dp_shard = -1"), std::string::npos) << "a -1 that cannot fill the world offered: " << no_fill;
}

// dp_shard = -1 by default: an unset layout fills the world with FSDP; a -1
// the deck gives another axis takes that role instead.
TEST(ResolveMesh, DefaultShardFillsTheWorld) {
  EXPECT_EQ(config_with({}).parallel.dp_shard, -1);
  EXPECT_EQ(resolve_mesh(config_with({}).parallel, 1).str(), "pp=1 dp_replicate=1 dp_shard=1 cp=1 tp=1");
  EXPECT_EQ(resolve_mesh(config_with({}).parallel, 4).str(), "pp=1 dp_replicate=1 dp_shard=4 cp=1 tp=1");
  EXPECT_EQ(resolve_mesh(config_with({"parallel.tp=2"}).parallel, 8).str(), "pp=1 dp_replicate=1 dp_shard=4 cp=1 tp=2");
  EXPECT_EQ(resolve_mesh(config_with({"parallel.tp=-1"}).parallel, 4).str(),
            "pp=1 dp_replicate=1 dp_shard=1 cp=1 tp=4");
  EXPECT_EQ(resolve_mesh(config_with({"parallel.dp_shard=1"}).parallel, 1).str(),
            "pp=1 dp_replicate=1 dp_shard=1 cp=1 tp=1");
  expect_refused({"parallel.tp=2"}, 3,
                 {"parallel.dp_shard = -1 (the default) cannot be resolved", "(dp_replicate=1 x tp=2 x cp=1 x pp=1)",
                  "multiply to 2", "launch a multiple of 2 ranks (mpiexec -n 2)"});
  const ParallelConfig p = config_with({}).parallel;
  EXPECT_EQ(describe_filled_degree(p, resolve_mesh(p, 4)),
            "parallel.dp_shard = -1 (the default) fills the world: dp_shard = 4 of 4 ranks; set the degrees to "
            "choose another layout");
  const ParallelConfig set = config_with({"parallel.dp_shard=2"}).parallel;
  EXPECT_EQ(describe_filled_degree(set, resolve_mesh(set, 2)), "");
}

TEST(ResolveMesh, ContextAndPipelineRules) {
  // seq_len 32: 2 cp must divide it.
  EXPECT_EQ(resolve_error({"parallel.cp=4"}, 4), "");
  expect_refused({"parallel.cp=2", "model.seq_len=30"}, 2,
                 {"model.seq_len = 30 is not divisible by 2 x parallel.cp = 4", "two chunks"});
  // With SP, tp divides each cp rank's share of the sequence.
  expect_refused({"parallel.cp=2", "parallel.tp=4", "parallel.sequence_parallel=true", "model.seq_len=20"}, 8,
                 {"model.seq_len / parallel.cp = 20 / 2 = 10 is not divisible by parallel.tp = 4"});
  // A chunk per layer at least: layers = 2 here.
  EXPECT_EQ(resolve_error({"parallel.pp=2"}, 2), "");
  expect_refused({"parallel.pp=4"}, 4, {"model.layers = 2 is fewer than the 4 pipeline chunks", "parallel.pp = 4"});
  expect_refused({"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=interleaved_1f1b"}, 2,
                 {"model.layers = 2 is fewer than the 4 pipeline chunks", "virtual_stages = 2"});
  expect_refused({"parallel.pp=2", "parallel.virtual_stages=2", "model.layers=4"}, 2,
                 {"parallel.virtual_stages = 2 needs parallel.schedule = \"interleaved_1f1b\""});
  // 1F1B needs pp micro-batches: 64 / (1 x 32) = 2 < 4.
  expect_refused({"parallel.pp=4", "model.layers=4", "train.micro_batch=32"}, 4,
                 {"needs at least pp micro-batches per step, but each pipeline gets 2"});
  EXPECT_EQ(resolve_error({"parallel.pp=4", "model.layers=4", "train.micro_batch=32", "parallel.schedule=gpipe"}, 4),
            "");
  // Interleaved: the micro-batches a multiple of pp (64 / 16 = 4 micro-batches; pp = 3 does not divide them).
  expect_refused({"parallel.pp=3", "parallel.virtual_stages=2", "parallel.schedule=interleaved_1f1b", "model.layers=6",
                  "train.micro_batch=16"},
                 3, {"to be a multiple of parallel.pp = 3"});
}

TEST(ResolveMesh, RefusesTpThatDoesNotDivideTheModel) {
  expect_refused({"parallel.tp=3"}, 3, {"model.heads = 8 is not divisible by parallel.tp = 3"});
  // 4C has no case of its own: C = heads x head size, so tp | heads already gives tp | 4C.
  expect_refused({"parallel.tp=2", "model.vocab=50257"}, 2,
                 {"model.vocab = 50257 is not divisible by parallel.tp = 2", "pad it (e.g. 50304)"});
  expect_refused({"parallel.tp=2", "parallel.sequence_parallel=true", "model.seq_len=33"}, 2,
                 {"model.seq_len = 33 is not divisible by parallel.tp = 2", "sequence_parallel"});
  // Sequence parallelism with tp = 1 is a harmless no-op.
  EXPECT_EQ(resolve_error({"parallel.sequence_parallel=true", "model.seq_len=33"}, 1), "");
}

TEST(ResolveMesh, RefusesBatchThatDoesNotSplit) {
  expect_refused({"parallel.dp_shard=4", "train.global_batch=8", "train.micro_batch=4"}, 4,
                 {"train.global_batch = 8 must be a multiple of dp_replicate x dp_shard x micro_batch = 16",
                  "whole micro-batches"});
  // tp ranks share their batch, so tp does not count.
  EXPECT_EQ(resolve_error({"parallel.tp=4", "train.global_batch=8", "train.micro_batch=4"}, 4), "");
}

TEST(DescribeMesh, ListsRanksAndGroups) {
  const ParallelDims s = shape_of(1, 2, 1, 1, 2);
  EXPECT_EQ(describe_mesh(s, false), "mesh pp=1 dp_replicate=2 dp_shard=1 cp=1 tp=2 (4 ranks)\n");
  const std::string d = describe_mesh(s, true);
  EXPECT_NE(d.find("rank  pp dp_replicate dp_shard cp tp"), std::string::npos) << d;
  EXPECT_NE(d.find("tp groups: [0 1] [2 3]"), std::string::npos) << d;
  EXPECT_NE(d.find("dp_replicate groups: [0 2] [1 3]"), std::string::npos) << d;
  EXPECT_EQ(d.find("fsdp groups"), std::string::npos) << d;

  const std::string f = describe_mesh(shape_of(1, 1, 2, 1, 2), true);
  EXPECT_NE(f.find("fsdp groups (dp_shard x cp): [0 2] [1 3]"), std::string::npos) << f;
}

TEST(DescribeMesh, StaysCompactForBigMeshes) {
  const std::string d = describe_mesh(shape_of(1, 64, 2, 1, 8), true);  // 1024 ranks
  EXPECT_LT(std::count(d.begin(), d.end(), '\n'), 40) << d;
  EXPECT_NE(d.find("more"), std::string::npos) << d;
}

// Every factorization of the world over the five axes, built for real.
std::vector<ParallelDims> factorizations(int n) {
  std::vector<ParallelDims> out;
  for (int pp = 1; pp <= n; ++pp)
    for (int r = 1; pp * r <= n; ++r)
      for (int s = 1; pp * r * s <= n; ++s)
        for (int cp = 1; pp * r * s * cp <= n; ++cp) {
          const int rest = pp * r * s * cp;
          if (n % rest == 0) out.push_back(shape_of(pp, r, s, cp, n / rest));
        }
  return out;
}

TEST(Mesh, EveryLayoutOfTheWorld) {
  const int n = world_size(), me = world_rank();
  int layouts = 0;
  for (const ParallelDims& shape : factorizations(n)) {
    SCOPED_TRACE(shape.str());
    ++layouts;
    Mesh mesh(shape, MPI_COMM_WORLD);
    const Coords mine = shape.coords_of(me);
    EXPECT_EQ(mesh.rank(), me);
    EXPECT_EQ(mesh.size(), n);
    for (Axis a : kAxes) EXPECT_EQ(mesh.coord(a), mine[static_cast<int>(a)]);

    int cart_coords[kNumAxes];
    MPI_Cart_coords(mesh.cart(), me, kNumAxes, cart_coords);
    for (int i = 0; i < kNumAxes; ++i) EXPECT_EQ(cart_coords[i], mine[i]);

    for (Axis a : kAxes) {
      int size = 0, rank = -1;
      MPI_Comm_size(mesh.axis(a), &size);
      MPI_Comm_rank(mesh.axis(a), &rank);
      EXPECT_EQ(size, shape.degree_of(a)) << axis_name(a);
      EXPECT_EQ(rank, mine[static_cast<int>(a)]) << axis_name(a);  // the axis rank is the coordinate
      const auto group = expected_group(shape, mine, {a});
      int want = 0;
      for (int g : group) want += g;
      EXPECT_EQ(sum_over(mesh.axis(a), me), want) << axis_name(a);
      EXPECT_EQ(members(mesh.axis(a)), group) << axis_name(a);
    }

    // tp on consecutive world ranks: the placement rule's whole point.
    const auto tp = members(mesh.axis(Axis::tp));
    for (std::size_t i = 1; i < tp.size(); ++i) EXPECT_EQ(tp[i], tp[i - 1] + 1);

    const auto fsdp = expected_group(shape, mine, {Axis::dp_shard, Axis::cp});
    const auto batch = expected_group(shape, mine, {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp});
    const auto norm = expected_group(shape, mine, {Axis::pp, Axis::dp_shard, Axis::cp, Axis::tp});
    const int pp = shape.degree_of(Axis::pp), tp_ = shape.degree_of(Axis::tp);
    EXPECT_EQ(fsdp.size(), static_cast<std::size_t>(shape.degree_of(Axis::dp_shard) * shape.degree_of(Axis::cp)));
    EXPECT_EQ(batch.size(), static_cast<std::size_t>(n / tp_));
    EXPECT_EQ(norm.size(), static_cast<std::size_t>(n / shape.degree_of(Axis::dp_replicate)));
    EXPECT_EQ(members(mesh.fsdp()), fsdp);
    EXPECT_EQ(members(mesh.batch()), batch);
    EXPECT_EQ(members(mesh.norm()), norm);
    // The degrees' accessors name the sizes of the groups the mesh builds.
    EXPECT_EQ(static_cast<std::size_t>(shape.fsdp()), fsdp.size());
    EXPECT_EQ(static_cast<std::size_t>(shape.batch()), batch.size());
    EXPECT_EQ(static_cast<std::size_t>(shape.norm()), norm.size());
    EXPECT_EQ(shape.data_parallel(), shape.degree_of(Axis::dp_replicate) * shape.degree_of(Axis::dp_shard));

    // The tied wte: the first and the last stage of this rank's pipeline, first stage first.
    const int stage = mine[static_cast<int>(Axis::pp)];
    if (pp > 1 && (stage == 0 || stage == pp - 1)) {
      Coords first = mine, last = mine;
      first[static_cast<int>(Axis::pp)] = 0;
      last[static_cast<int>(Axis::pp)] = pp - 1;
      EXPECT_EQ(members(mesh.pipeline_ends()), (std::vector<int>{shape.rank_of(first), shape.rank_of(last)}));
    } else {
      EXPECT_EQ(mesh.pipeline_ends(), MPI_COMM_NULL);
    }

    // Node awareness: sane, and agreed on by every rank.
    EXPECT_GE(mesh.ranks_per_node(), 1);
    EXPECT_LE(mesh.ranks_per_node(), n);
    const int spans = (mesh.tp_spans_nodes() ? 1 : 0) + (mesh.cp_spans_nodes() ? 2 : 0);
    const int lo = all_reduce(spans, MPI_MIN, MPI_COMM_WORLD), hi = all_reduce(spans, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
    const int fewest = all_reduce(mesh.ranks_per_node(), MPI_MIN, MPI_COMM_WORLD);
    if (fewest == n) EXPECT_FALSE(mesh.tp_spans_nodes() || mesh.cp_spans_nodes());  // one node: nothing can span
  }
  EXPECT_GE(layouts, 1);
}

// A shape that does not match the communicator is refused on every rank alike.
TEST(Mesh, RefusesWrongSizeOnEveryRank) {
  const int n = world_size();
  try {
    Mesh mesh(shape_of(1, 1, 1, 1, n + 1), MPI_COMM_WORLD);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(n + 1) + " ranks"), std::string::npos) << e.what();
  }
}

// resolve_mesh and Mesh together, as the trainer will use them.
TEST(Mesh, FromTheDeck) {
  const int n = world_size();
  const Config cfg = config_with({"parallel.dp_shard=-1", "train.global_batch=" + std::to_string(2 * n)});
  Mesh mesh(resolve_layout(cfg, n).dims, MPI_COMM_WORLD);
  EXPECT_EQ(mesh.degree(Axis::dp_shard), n);
  int size = 0;
  MPI_Comm_size(mesh.fsdp(), &size);
  EXPECT_EQ(size, n);
}

// Expert parallelism: the expert groups are ep consecutive ranks of
// dp_shard x cp x tp (innermost first), not a mesh axis; the experts' FSDP
// group is the rest of dp_shard x cp x tp, inside one (pp, dp_replicate) block.
TEST(ParallelDims, ExpertGroupsAreConsecutiveRanksOfDpShardCpTp) {
  using Groups = std::vector<std::vector<int>>;
  // dp_replicate 2 x dp_shard 2 x tp 2: blocks of 4 ranks, ep 2 inside each.
  ParallelDims s = shape_of(1, 2, 2, 1, 2);
  s.ep = 2;
  EXPECT_EQ(s.expert_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(s.expert_fsdp_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(s.expert_fsdp(), 2);
  EXPECT_EQ(s.ep_rank(3), 1);
  // ep 4 spans dp_shard x tp of one replica; its FSDP group is one rank.
  s.ep = 4;
  EXPECT_EQ(s.expert_groups(), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(s.expert_fsdp_groups(), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // pp 2 x dp_shard 4 x cp 2, ep 2: never across a stage or a cp group's outer axes.
  ParallelDims p = shape_of(2, 1, 4, 2, 1);
  p.ep = 2;
  const Groups groups = p.expert_groups();
  ASSERT_EQ(groups.size(), 8u);
  EXPECT_EQ(groups[0], (std::vector<int>{0, 1}));  // cp 0 and 1 of dp_shard 0
  EXPECT_EQ(groups[4], (std::vector<int>{8, 9}));  // stage 1 starts its own
  EXPECT_EQ(p.expert_fsdp_groups()[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(p.expert_fsdp_groups()[2], (std::vector<int>{8, 10, 12, 14}));
  // ep 1: every rank its own group, the experts sharded as the dense parameters over dp_shard x cp x tp.
  ParallelDims one = shape_of(1, 1, 2, 1, 2);
  EXPECT_EQ(one.expert_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(one.expert_fsdp_groups(), (Groups{{0, 1, 2, 3}}));
  // Every rank in exactly one group of each kind, of the right size.
  for (const Groups& gs : {groups, p.expert_fsdp_groups()}) {
    std::vector<int> seen(p.size(), 0);
    for (const auto& g : gs)
      for (int r : g) ++seen[r];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), p.size());
  }
}

TEST(ResolveMesh, ExpertParallelRules) {
  const std::vector<std::string> moe = {"model.moe_experts=4", "parallel.dp_shard=2", "parallel.tp=2",
                                        "parallel.sequence_parallel=true"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return more;
  };
  const ParallelDims s = resolve(with({"parallel.ep=4"}), 4);
  EXPECT_EQ(s.ep, 4);
  EXPECT_EQ(s.expert_fsdp(), 1);
  // ep must divide dp_shard x cp x tp (not dp_replicate, not pp).
  expect_refused(with({"parallel.ep=4", "parallel.dp_shard=1", "parallel.dp_replicate=2"}), 4,
                 {"parallel.ep = 4 does not divide dp_shard x cp x tp = 1 x 1 x 2 = 2"});
  // tp with an MoE block needs sequence parallelism.
  expect_refused(with({"parallel.ep=2", "parallel.sequence_parallel=false"}), 4,
                 {"parallel.tp = 2 with an MoE block needs parallel.sequence_parallel = true"});
  // A dense model with tp and no SP stays as it was.
  EXPECT_EQ(resolve({"parallel.tp=2", "parallel.dp_shard=2"}, 4).ep, 1);
  // The shared expert splits over tp.
  expect_refused(with({"model.moe_shared_hidden=3"}), 4, {"model.moe_shared_hidden = 3 is not divisible by"});
}

TEST(DescribeMesh, ListsTheExpertGroups) {
  ParallelDims s = shape_of(1, 2, 2, 1, 2);
  s.ep = 2;
  const std::string text = describe_mesh(s, true);
  EXPECT_NE(text.find("expert groups (ep = 2 consecutive ranks of dp_shard x cp x tp): [0 1] [2 3] [4 5] [6 7]"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("expert fsdp groups (the rest of dp_shard x cp x tp, 2 ranks; replicated over dp_replicate): "
                      "[0 2] [1 3] [4 6] [5 7]"),
            std::string::npos)
      << text;
  s.ep = 1;
  EXPECT_EQ(describe_mesh(s, true).find("expert"), std::string::npos);
}
