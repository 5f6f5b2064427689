// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A test hook of the MoE layer (TrainOptions::replay_routing, TrainCapture::
// routing): the experts a run chose for each token, by the token's global
// identity, so that another layout's run can compare its routing with them
// or replay them (tests/test_equivalence.cpp). Under bf16 the learned
// router's scores differ between layouts by rounding, and a row whose k-th
// and next scores nearly tie may go to another expert, which no bound on
// the rest of the block can absorb; replaying the choices takes that one
// decision out of the comparison. A replaying run still computes its own
// scores, gate weights (renormalised over the replayed experts) and
// auxiliary losses: only which experts is replayed.
//
// A token is named as every layout names it: the pass (the step of the
// parameters it ran on, training or forward-only), the block, the global
// batch it was read from (the data's step), its sequence in that batch and
// its position. Each rank records and looks up only the rows it routes; every
// token of a pass is routed once per MoE block, on one rank.
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace ndmini {

struct MoeToken {
  std::int64_t step = 0;      // the parameters' step: training step s, or an evaluation after s updates
  bool evaluation = false;    // a forward-only pass (the validation loss, the final state's check)
  int layer = 0;              // the block
  std::int64_t batch = 0;     // the data's step the token was read from
  std::int64_t sequence = 0;  // in that global batch
  int position = 0;           // in the sequence
  bool operator<(const MoeToken& o) const {
    return std::tie(step, evaluation, layer, batch, sequence, position) <
           std::tie(o.step, o.evaluation, o.layer, o.batch, o.sequence, o.position);
  }
};

// One token's routing: its k experts in slot order, and the E values the
// top-k chose them by (the scores, plus the sigmoid router's selection bias).
struct MoeChoice {
  std::vector<std::int32_t> experts;
  std::vector<float> select;
};
using MoeRouting = std::map<MoeToken, MoeChoice>;

// Where a run's routing goes and comes from, and which tokens the MoE layer
// routes next: the trainer sets the pass, the feed the micro-batch, the
// model the block (`next` names the micro-batch's first sequence, position 0).
struct MoeRoutingLog {
  MoeRouting* record = nullptr;        // this rank's choices are added here (null: none)
  const MoeRouting* replay = nullptr;  // the choices taken instead of the router's own (null: route freely)
  MoeToken next;
};

}  // namespace ndmini
