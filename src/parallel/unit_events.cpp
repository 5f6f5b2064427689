// SPDX-License-Identifier: BSD-3-Clause
// The builder of a chunk's unit events. The order is StageRuntime's: each
// unit's all-gather is started one unit ahead, so it overlaps the compute
// before it; gradients end right after their compute, so reduce-scatters
// overlap the next unit's backward.
#include "parallel/unit_events.hpp"

#include "core/error.hpp"

namespace ndmini {
namespace {

const char* name_of(UnitOp op) {
  switch (op) {
    case UnitOp::gather:
      return "gather";
    case UnitOp::prefetch:
      return "prefetch";
    case UnitOp::release:
      return "release";
    case UnitOp::open_grads:
      return "open grads of";
    case UnitOp::end_grads:
      return "end grads of";
    case UnitOp::poll:
      return "poll";
    case UnitOp::compute:
      return "compute";
  }
  return "?";
}

std::string name_of(Part p, int block) {
  const std::string b = "block " + std::to_string(block);
  switch (p) {
    case Part::embedding_forward:
      return "embedding forward";
    case Part::block_forward:
      return b + " forward";
    case Part::head_forward:
      return "head forward";
    case Part::head_backward:
      return "head backward";
    case Part::block_recompute:
      return b + " recompute";
    case Part::block_backward:
      return b + " backward";
    case Part::embedding_backward:
      return "embedding backward";
    case Part::end_of_evaluation:
      return "end of evaluation";
  }
  return "?";
}

class Events {
 public:
  // A none unit adds nothing (no unit runs next: nothing to prefetch).
  void add(UnitOp op, Part part, UnitId unit, int block = 0) {
    if (op != UnitOp::compute && op != UnitOp::poll && unit.is_none()) return;
    list_.push_back({op, part, block, unit});
  }
  std::vector<UnitEvent> take() { return std::move(list_); }

 private:
  std::vector<UnitEvent> list_;
};

// wte's lifetime in one chunk. The embedding reads it; the tied head reads
// it and adds to its gradients. With both in the chunk (pp = 1) it stays
// gathered, and its gradients open, from the embedding's forward to the end
// of the embedding's backward: one all-gather and one reduce-scatter per
// micro-batch. Otherwise each use is a scope of its own: so too the untied
// head's lm_head (`spans` false), used by the head alone.
class WteLifetime {
 public:
  WteLifetime(const Chunk& c, UnitId wte, bool spans = true)
      : wte_(wte), spans_chunk_(spans && c.embedding && c.head) {}
  void use(Events& e, Part p) const { e.add(UnitOp::gather, p, wte_); }  // a no-op while it spans
  void done_using(Events& e, Part p) const {
    if (!spans_chunk_) e.add(UnitOp::release, p, wte_);
  }
  void open_grads(Events& e, Part p) const { e.add(UnitOp::open_grads, p, wte_); }
  void head_grads_done(Events& e, Part p) const {
    if (!spans_chunk_) e.add(UnitOp::end_grads, p, wte_);
  }
  void embedding_backward_done(Events& e, Part p) const {
    e.add(UnitOp::end_grads, p, wte_);
    if (spans_chunk_) e.add(UnitOp::release, p, wte_);
  }

 private:
  UnitId wte_;
  bool spans_chunk_;
};

struct Units {
  UnitId wte, wpe, ln_f, lm_head;
  std::vector<UnitId> blocks;
  explicit Units(const ChunkUnits& u)
      : wte(UnitId::of_layout_index(u.wte)),
        wpe(UnitId::of_layout_index(u.wpe)),
        ln_f(UnitId::of_layout_index(u.ln_f)),
        lm_head(UnitId::of_layout_index(u.lm_head)) {
    for (int b : u.blocks) blocks.push_back(UnitId::of_layout_index(b));
  }
  bool tied() const { return lm_head.is_none(); }
  // The LM head's matrix: wte's lifetime when tied, lm_head's own scope when not.
  WteLifetime head_matrix(const Chunk& c) const {
    return tied() ? WteLifetime(c, wte) : WteLifetime(c, lm_head, false);
  }
  int block_count() const { return static_cast<int>(blocks.size()); }
  // The unit whose compute follows block i's forward: the next block, or the head's ln_f (none elsewhere).
  UnitId after_block(int i) const { return i + 1 < block_count() ? blocks[i + 1] : ln_f; }
};

void forward(Events& e, const Chunk& c, const Units& u, const UnitPolicy& p) {
  const WteLifetime wte(c, u.wte, u.tied());
  if (c.embedding) {
    const Part part = Part::embedding_forward;
    wte.use(e, part);
    e.add(UnitOp::gather, part, u.wpe);
    e.add(UnitOp::prefetch, part, u.blocks.empty() ? u.ln_f : u.blocks.front());
    e.add(UnitOp::compute, part, UnitId::none());
    e.add(UnitOp::release, part, u.wpe);
    wte.done_using(e, part);  // the head of the same chunk uses it too
  }
  for (int i = 0; i < u.block_count(); ++i) {
    const Part part = Part::block_forward;
    e.add(UnitOp::gather, part, u.blocks[i], i);
    e.add(UnitOp::prefetch, part, u.after_block(i), i);
    e.add(UnitOp::compute, part, u.blocks[i], i);
    if (p.reshard == Reshard::after_forward) e.add(UnitOp::release, part, u.blocks[i], i);
  }
  if (!c.head) return;
  const WteLifetime head = u.head_matrix(c);
  Part part = Part::head_forward;
  e.add(UnitOp::gather, part, u.ln_f);
  head.use(e, part);
  e.add(UnitOp::compute, part, UnitId::none());
  if (p.pass == Pass::train) {  // the head's backward at once: the loss's gradient needs no other stage
    part = Part::head_backward;
    head.open_grads(e, part);
    e.add(UnitOp::open_grads, part, u.ln_f);
    e.add(UnitOp::compute, part, UnitId::none());
    e.add(UnitOp::end_grads, part, u.ln_f);
    head.head_grads_done(e, part);
  }
  head.done_using(e, part);
  e.add(UnitOp::release, part, u.ln_f);
}

void backward(Events& e, const Chunk& c, const Units& u, const UnitPolicy& p) {
  if (p.pass == Pass::evaluation) throw InternalError("a forward-only pass has no backward");
  for (int i = u.block_count() - 1; i >= 0; --i) {
    const Part part = Part::block_backward;
    e.add(UnitOp::gather, part, u.blocks[i], i);
    e.add(UnitOp::prefetch, part, i > 0 ? u.blocks[i - 1] : UnitId::none(), i);  // the block before runs next
    e.add(UnitOp::open_grads, part, u.blocks[i], i);
    e.add(UnitOp::poll, part, UnitId::none(), i);
    if (p.recompute == Recompute::block) e.add(UnitOp::compute, Part::block_recompute, u.blocks[i], i);
    e.add(UnitOp::compute, part, u.blocks[i], i);
    e.add(UnitOp::end_grads, part, u.blocks[i], i);
    e.add(UnitOp::release, part, u.blocks[i], i);
  }
  if (!c.embedding) return;
  const WteLifetime wte(c, u.wte, u.tied());
  const Part part = Part::embedding_backward;
  wte.open_grads(e, part);
  e.add(UnitOp::open_grads, part, u.wpe);
  e.add(UnitOp::compute, part, UnitId::none());
  e.add(UnitOp::end_grads, part, u.wpe);
  wte.embedding_backward_done(e, part);
}

}  // namespace

std::string describe(const UnitEvent& e) {
  std::string s = name_of(e.op);
  if (e.op != UnitOp::compute && e.op != UnitOp::poll) s += " " + e.unit.name();
  return s + " (" + name_of(e.part, e.block) + ")";
}

std::vector<UnitEvent> unit_events(const Chunk& c, const ChunkUnits& u, PipelineAction::Kind kind,
                                   const UnitPolicy& policy) {
  Events e;
  if (kind == PipelineAction::Kind::forward)
    forward(e, c, Units(u), policy);
  else
    backward(e, c, Units(u), policy);
  return e.take();
}

std::vector<UnitEvent> end_of_evaluation_events(int units) {
  Events e;
  for (int u = 0; u < units; ++u) e.add(UnitOp::release, Part::end_of_evaluation, UnitId(u));
  return e.take();
}

std::vector<UnitEvent> stage_unit_events(const std::vector<Chunk>& chunks, const std::vector<PipelineAction>& actions,
                                         const UnitPolicy& policy) {
  return stage_unit_events(chunks, gpt_chunk_units(chunks), actions, policy);
}

std::vector<UnitEvent> stage_unit_events(const std::vector<Chunk>& chunks, const std::vector<ChunkUnits>& units,
                                         const std::vector<PipelineAction>& actions, const UnitPolicy& policy) {
  std::vector<UnitEvent> out;
  for (const PipelineAction& a : actions) {
    std::size_t k = 0;
    while (k < chunks.size() && chunks[k].index != a.chunk) ++k;
    if (k == chunks.size()) continue;
    const std::vector<UnitEvent> events = unit_events(chunks[k], units[k], a.kind, policy);
    out.insert(out.end(), events.begin(), events.end());
  }
  return out;
}

}  // namespace ndmini
