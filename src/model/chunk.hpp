// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A chunk of the model: contiguous layers a pipeline stage runs as one piece
// (parallel/pipeline/schedule.hpp decides which stage runs which chunk).

namespace ndmini {

// The layers of one chunk and what else it runs.
struct Chunk {
  int index = 0;        // 0 .. S-1, in model order
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  bool embedding = false;  // chunk 0: wte and wpe lookups
  bool head = false;       // chunk S-1: ln_f, the tied LM head and the loss
  int layers() const { return end_layer - first_layer; }
};

}  // namespace ndmini
