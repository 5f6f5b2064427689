// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A test hook of the training loop (TrainOptions::capture): global tensors
// captured from a run, for comparing layouts. Every rank receives the full
// tensors, assembled from the owners' blocks; the routing only its own tokens'.
#include <map>
#include <string>
#include <vector>

#include "layers/moe_routing.hpp"
#include "parallel/unit_events.hpp"
#include "train/trainer.hpp"

namespace ndmini {

struct TrainCapture {
  std::map<std::string, std::vector<float>> first_step_grads;  // after reduction, before clipping
  std::map<std::string, std::vector<float>> final_params;
  bool tied_wte_identical = false;     // after the last step: both pipeline ends hold the same wte, bit for bit
  std::vector<UnitEvent> unit_events;  // every unit event this rank's runtime executed, in order
  MoeRouting routing;                  // the experts of every token this rank's MoE blocks routed
};

}  // namespace ndmini
