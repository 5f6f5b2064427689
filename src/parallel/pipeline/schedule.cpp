// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/pipeline/schedule.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ndmini {

// ---- stages ---------------------------------------------------------------

StagePlan::StagePlan(int layers, int pp, int virtual_stages) : layers_(layers), pp_(pp), v_(virtual_stages) {
  if (pp < 1 || virtual_stages < 1 || layers < pp * virtual_stages)
    throw InternalError("a stage plan needs at least one layer per chunk (check_schedule should have refused it)");
}

Chunk StagePlan::chunk(int index) const {
  const int n = chunks(), base = layers_ / n, extra = layers_ % n;
  Chunk c;
  c.index = index;
  // The first `extra` chunks take one layer more.
  c.first_layer = index * base + std::min(index, extra);
  c.end_layer = c.first_layer + base + (index < extra ? 1 : 0);
  c.embedding = index == 0;
  c.head = index == n - 1;
  return c;
}

std::vector<Chunk> StagePlan::chunks_of(int stage) const {
  std::vector<Chunk> out;
  for (int k = stage; k < chunks(); k += pp_) out.push_back(chunk(k));
  return out;
}

std::string StagePlan::describe() const {
  std::string out;
  for (int r = 0; r < pp_; ++r) {
    if (r) out += " | ";
    out += "stage " + std::to_string(r) + ":";
    for (const Chunk& c : chunks_of(r)) {
      out += " layers " + std::to_string(c.first_layer) + "-" + std::to_string(c.end_layer - 1);
      if (c.embedding) out += " (+embedding)";
      if (c.head) out += " (+head)";
      if (v_ > 1) out += ";";
    }
    if (v_ > 1) out.pop_back();
  }
  return out;
}

// ---- schedules --------------------------------------------------------------

Schedule::Schedule(ScheduleKind kind, int pp, int virtual_stages, int micro_batches)
    : kind_(pp == 1 ? ScheduleKind::none : kind), pp_(pp), v_(virtual_stages), m_(micro_batches) {}

std::vector<PipelineAction> Schedule::actions(int stage) const {
  using Kind = PipelineAction::Kind;
  std::vector<PipelineAction> out;
  const int r = stage;
  switch (kind_) {
    case ScheduleKind::none:
      for (int mb = 0; mb < m_; ++mb) {
        out.push_back({Kind::forward, mb, r});
        out.push_back({Kind::backward, mb, r});
      }
      break;
    case ScheduleKind::gpipe:
      for (int mb = 0; mb < m_; ++mb) out.push_back({Kind::forward, mb, r});
      for (int mb = 0; mb < m_; ++mb) out.push_back({Kind::backward, mb, r});
      break;
    case ScheduleKind::one_f_one_b: {
      const int warmup = std::min(pp_ - r - 1, m_);
      int f = 0, b = 0;
      for (; f < warmup; ++f) out.push_back({Kind::forward, f, r});
      for (; f < m_; ++f, ++b) {
        out.push_back({Kind::forward, f, r});
        out.push_back({Kind::backward, b, r});
      }
      for (; b < m_; ++b) out.push_back({Kind::backward, b, r});
      break;
    }
    case ScheduleKind::interleaved: {
      // Megatron-LM's interleaved 1F1B: the k-th forward (backward) step of a
      // rank runs micro-batch mb(k) through its local chunk c(k); chunks take
      // turns in groups of pp micro-batches.
      const int total = m_ * v_, group = pp_ * v_;
      const int warmup = m_ == pp_ ? total : std::min(2 * (pp_ - r - 1) + (v_ - 1) * pp_, total);
      auto local_chunk = [&](int k, bool forward) {
        const int c = (k % group) / pp_;
        return forward ? c : v_ - 1 - c;
      };
      auto micro_batch = [&](int k) { return (k / group) * pp_ + k % pp_; };
      auto action = [&](Kind kind, int k) {
        return PipelineAction{kind, micro_batch(k), local_chunk(k, kind == Kind::forward) * pp_ + r};
      };
      int f = 0, b = 0;
      for (; f < warmup; ++f) out.push_back(action(Kind::forward, f));
      for (; f < total; ++f, ++b) {
        out.push_back(action(Kind::forward, f));
        out.push_back(action(Kind::backward, b));
      }
      for (; b < total; ++b) out.push_back(action(Kind::backward, b));
      break;
    }
  }
  return out;
}

int Schedule::max_in_flight(int stage) const {
  int now = 0, most = 0;
  for (const PipelineAction& a : actions(stage)) {
    now += a.kind == PipelineAction::Kind::forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

double Schedule::ideal_bubble() const {
  const int v = kind_ == ScheduleKind::interleaved ? v_ : 1;
  return static_cast<double>(pp_ - 1) / (v * m_ + pp_ - 1);
}

void check_schedule(ScheduleKind kind, int pp, int virtual_stages, int micro_batches, int layers) {
  using std::to_string;
  require(virtual_stages >= 1, "parallel.virtual_stages = " + to_string(virtual_stages) + " must be at least 1");
  if (virtual_stages > 1)
    require(kind == ScheduleKind::interleaved && pp > 1,
            "parallel.virtual_stages = " + to_string(virtual_stages) +
                " needs parallel.schedule = \"interleaved_1f1b\" and parallel.pp > 1; set virtual_stages = 1");
  const int chunks = pp * virtual_stages;
  require(layers >= chunks, "model.layers = " + to_string(layers) + " is fewer than the " + to_string(chunks) +
                                " pipeline chunks (parallel.pp = " + to_string(pp) + " x parallel.virtual_stages = " +
                                to_string(virtual_stages) + "); every chunk needs a layer: lower pp or virtual_stages");
  if (pp == 1) return;
  if (kind == ScheduleKind::one_f_one_b || kind == ScheduleKind::interleaved)
    require(micro_batches >= pp, "parallel.pp = " + to_string(pp) + " with schedule \"" + name_of(kind) +
                                     "\" needs at least pp micro-batches per step, but each pipeline gets " +
                                     to_string(micro_batches) +
                                     " (train.global_batch / (dp_replicate x dp_shard x train.micro_batch)); "
                                     "raise train.global_batch or lower train.micro_batch");
  if (kind == ScheduleKind::interleaved)
    require(micro_batches % pp == 0, "schedule \"interleaved_1f1b\" needs the micro-batches per step (" +
                                         to_string(micro_batches) + ") to be a multiple of parallel.pp = " +
                                         to_string(pp) + "; change train.global_batch or train.micro_batch");
}

}  // namespace ndmini
