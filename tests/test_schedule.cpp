// SPDX-License-Identifier: BSD-3-Clause
// Pipeline stages and schedules: the layer split, the exact action order of
// each schedule on small cases (against hand-written sequences), the number
// of micro-batches in flight, and -- for many (pp, virtual stages,
// micro-batches) -- a simulation of every stage running its actions with
// blocking receives and non-blocking sends (as PipelineRunner does): every
// schedule must finish (no deadlock), run each (micro-batch, chunk) forward
// and backward exactly once, and respect the data dependencies.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "parallel/pipeline/schedule.hpp"

using namespace ndmini;
using Kind = PipelineAction::Kind;

namespace {

// "F0 B0 F1 ..." with the chunk when there are virtual stages: "F0.2".
std::string render(const std::vector<PipelineAction>& actions, bool chunks) {
  std::string out;
  for (const auto& a : actions) {
    if (!out.empty()) out += ' ';
    out += (a.kind == Kind::forward ? "F" : "B") + std::to_string(a.micro_batch);
    if (chunks) out += "." + std::to_string(a.chunk);
  }
  return out;
}

// Runs every stage's actions as far as its dependencies allow, round-robin:
// a forward of chunk k > 0 needs the forward of chunk k - 1 done, a backward
// of chunk k < S - 1 the backward of chunk k + 1 (the head's backward needs
// only its own forward). Returns false on a deadlock.
bool simulate(const Schedule& s, const StagePlan& plan, std::string* why) {
  const int pp = plan.pp(), S = plan.chunks(), m = s.micro_batches();
  std::vector<std::vector<PipelineAction>> lists(pp);
  for (int r = 0; r < pp; ++r) lists[r] = s.actions(r);
  std::vector<std::size_t> next(pp, 0);
  std::set<std::tuple<int, int, int>> done;  // (kind, micro-batch, chunk)
  auto is_done = [&](Kind k, int mb, int c) { return done.count({static_cast<int>(k), mb, c}) > 0; };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < lists[r].size()) {
        const PipelineAction a = lists[r][next[r]];
        if (plan.rank_of(a.chunk) != r) {
          *why = "stage " + std::to_string(r) + " runs chunk " + std::to_string(a.chunk) + " of another stage";
          return false;
        }
        const bool ready = a.kind == Kind::forward
                               ? (a.chunk == 0 || is_done(Kind::forward, a.micro_batch, a.chunk - 1))
                               : (a.chunk == S - 1 ? is_done(Kind::forward, a.micro_batch, a.chunk)
                                                   : is_done(Kind::backward, a.micro_batch, a.chunk + 1));
        if (!ready) break;
        if (a.kind == Kind::backward && !is_done(Kind::forward, a.micro_batch, a.chunk)) {
          *why = "backward before forward";
          return false;
        }
        if (!done.insert({static_cast<int>(a.kind), a.micro_batch, a.chunk}).second) {
          *why = "an action runs twice";
          return false;
        }
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < pp; ++r)
    if (next[r] < lists[r].size()) {
      *why = "deadlock: stage " + std::to_string(r) + " stuck at action " + std::to_string(next[r]);
      return false;
    }
  if (done.size() != static_cast<std::size_t>(2 * m * S)) {
    *why = "not every (micro-batch, chunk) ran forward and backward";
    return false;
  }
  return true;
}

// The messages of every pipeline edge (a pair of stages and a direction) in
// the order the sender sends them and in the order the receiver posts their
// receives: equal, so matching does not depend on tags (which wrap around).
bool pairwise_orders_match(const Schedule& s, const StagePlan& plan, std::string* why) {
  const int S = plan.chunks();
  using Message = std::tuple<int, int, bool>;  // (micro-batch, receiving chunk, gradient)
  std::map<std::pair<int, int>, std::vector<Message>> sent, posted;
  for (int r = 0; r < plan.pp(); ++r)
    for (const PipelineAction& a : s.actions(r)) {
      const bool fwd = a.kind == Kind::forward;
      if (fwd && a.chunk > 0) posted[{plan.rank_of(a.chunk - 1), r}].push_back({a.micro_batch, a.chunk, false});
      if (!fwd && a.chunk + 1 < S) posted[{plan.rank_of(a.chunk + 1), r}].push_back({a.micro_batch, a.chunk, true});
      if (fwd && a.chunk + 1 < S) sent[{r, plan.rank_of(a.chunk + 1)}].push_back({a.micro_batch, a.chunk + 1, false});
      if (!fwd && a.chunk > 0) sent[{r, plan.rank_of(a.chunk - 1)}].push_back({a.micro_batch, a.chunk - 1, true});
    }
  if (sent != posted) {
    *why = "a pipeline edge carries its messages in another order than its receiver posts them";
    return false;
  }
  return true;
}

}  // namespace

TEST(StagePlan, SplitsLayersContiguouslyFirstChunksTakeTheRest) {
  const StagePlan plan(7, 3, 1);
  ASSERT_EQ(plan.chunks(), 3);
  EXPECT_EQ(plan.chunk(0).first_layer, 0);
  EXPECT_EQ(plan.chunk(0).end_layer, 3);  // 7 = 3 + 2 + 2
  EXPECT_EQ(plan.chunk(1).first_layer, 3);
  EXPECT_EQ(plan.chunk(2).end_layer, 7);
  EXPECT_TRUE(plan.chunk(0).embedding);
  EXPECT_FALSE(plan.chunk(0).head);
  EXPECT_TRUE(plan.chunk(2).head);
  EXPECT_EQ(plan.describe(), "stage 0: layers 0-2 (+embedding) | stage 1: layers 3-4 | stage 2: layers 5-6 (+head)");
  // Interleaved: rank r holds chunks r, r + pp, ...
  const StagePlan v(8, 2, 2);
  const auto chunks = v.chunks_of(1);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].index, 1);
  EXPECT_EQ(chunks[1].index, 3);
  EXPECT_EQ(chunks[1].first_layer, 6);
  EXPECT_TRUE(chunks[1].head);
  EXPECT_EQ(v.rank_of(3), 1);
}

TEST(Schedule, NoPipelineRunsEachMicroBatchForwardThenBackward) {
  const Schedule s(ScheduleKind::one_f_one_b, 1, 1, 3);
  EXPECT_EQ(s.kind(), ScheduleKind::none);
  EXPECT_EQ(render(s.actions(0), false), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(s.max_in_flight(0), 1);
  EXPECT_DOUBLE_EQ(s.ideal_bubble(), 0.0);
}

TEST(Schedule, GPipeAllForwardsThenAllBackwards) {
  const Schedule s(ScheduleKind::gpipe, 2, 1, 3);
  EXPECT_EQ(render(s.actions(0), false), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(render(s.actions(1), false), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(s.max_in_flight(0), 3);
  EXPECT_DOUBLE_EQ(s.ideal_bubble(), 1.0 / 4);
}

TEST(Schedule, OneFOneBWarmsUpByDistanceToTheLastStage) {
  const Schedule s(ScheduleKind::one_f_one_b, 4, 1, 6);
  EXPECT_EQ(render(s.actions(0), false), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(render(s.actions(2), false), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(render(s.actions(3), false), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // In flight: pp - r, not m as with GPipe.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(s.max_in_flight(r), 4 - r) << "stage " << r;
  EXPECT_DOUBLE_EQ(s.ideal_bubble(), 3.0 / 9);
}

TEST(Schedule, InterleavedFollowsMegatron) {
  // pp = 2, v = 2, m = 4: chunks 0, 2 on stage 0 and 1, 3 on stage 1.
  const Schedule s(ScheduleKind::interleaved, 2, 2, 4);
  EXPECT_EQ(render(s.actions(0), true),
            "F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0 B2.2 B3.2 B2.0 B3.0");
  EXPECT_EQ(render(s.actions(1), true),
            "F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1");
  // In flight (chunk records): warm-up 2(pp - r - 1) + (v - 1) pp forwards, plus one.
  EXPECT_EQ(s.max_in_flight(0), 5);
  EXPECT_EQ(s.max_in_flight(1), 3);
  // The bubble shrinks by v.
  EXPECT_DOUBLE_EQ(s.ideal_bubble(), 1.0 / (2 * 4 + 1));
  EXPECT_LT(s.ideal_bubble(), Schedule(ScheduleKind::one_f_one_b, 2, 1, 4).ideal_bubble());
}

// For every valid (schedule, pp, v, m): no deadlock with non-blocking sends,
// each action once, dependencies kept, and every pipeline edge ordered alike
// on both ends.
TEST(Schedule, EveryScheduleFinishesAndRunsEachActionOnce) {
  int cases = 0;
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    for (int pp = 1; pp <= 5; ++pp)
      for (int v = 1; v <= (kind == ScheduleKind::interleaved ? 3 : 1); ++v)
        for (int m = 1; m <= 12; ++m) {
          const int layers = pp * v + 1;
          bool valid = true;
          try {
            check_schedule(kind, pp, v, m, layers);
          } catch (const Error&) {
            valid = false;
          }
          if (!valid) continue;
          const Schedule s(kind, pp, v, m);
          const StagePlan plan(layers, pp, v);
          std::string why;
          const std::string what = std::string(name_of(kind)) + " pp=" + std::to_string(pp) +
                                   " v=" + std::to_string(v) + " m=" + std::to_string(m) + ": ";
          EXPECT_TRUE(simulate(s, plan, &why)) << what << why;
          EXPECT_TRUE(pairwise_orders_match(s, plan, &why)) << what << why;
          ++cases;
        }
  EXPECT_GT(cases, 100);
}

TEST(Schedule, ChecksItsRules) {
  EXPECT_THROW(check_schedule(ScheduleKind::one_f_one_b, 4, 1, 3, 8), Error);  // fewer micro-batches than stages
  EXPECT_NO_THROW(check_schedule(ScheduleKind::gpipe, 4, 1, 3, 8));            // GPipe takes any m
  EXPECT_THROW(check_schedule(ScheduleKind::interleaved, 2, 2, 3, 8), Error);  // m not a multiple of pp
  EXPECT_THROW(check_schedule(ScheduleKind::one_f_one_b, 2, 2, 4, 8), Error);  // virtual stages need interleaving
  EXPECT_THROW(check_schedule(ScheduleKind::interleaved, 2, 2, 4, 3), Error);  // fewer layers than chunks
  EXPECT_STREQ(name_of(ScheduleKind::interleaved), "interleaved_1f1b");        // the deck's spelling (config.hpp)
}
