// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Pipeline parallelism, part 2: runs one optimizer step's schedule on this
// stage, moving activations and their gradients between neighbouring
// stages on the pp communicator.
//
// Before each action the runner waits for what it needs (the previous
// chunk's output before a forward, the next chunk's input gradient before a
// backward) -- that wait is the pipeline bubble -- and posts the receive of
// the following action, so its transfer can proceed during this action.
// After each action it sends the result NON-BLOCKING (a stage never waits
// for its neighbour to take a message) and completes the send before the
// buffer is reused. Messages are tagged by (micro-batch, chunk, direction).
#include <cstddef>
#include <deque>
#include <vector>

#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "parallel/pipeline/schedule.hpp"

namespace ndmini {

// What the runner needs of the stage's model (see GptStage, which the
// training loop adapts to this).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Floats of one activation (and of its gradient) between chunks.
  virtual std::size_t activation_elements() const = 0;
  virtual real* input_buffer(int chunk, int micro_batch) = 0;
  // Returns the micro-batch's loss sum on the head chunk, 0 elsewhere.
  virtual double forward(int chunk, int micro_batch, bool last_micro_batch) = 0;
  virtual const real* output(int chunk, int micro_batch) = 0;
  virtual real* output_grad_buffer(int chunk, int micro_batch) = 0;
  virtual void backward(int chunk, int micro_batch, real* input_grad, bool last_micro_batch) = 0;
};

class PipelineRunner {
 public:
  // pp: the pp group (its rank r runs the chunks StagePlan::chunks_of(r)).
  PipelineRunner(Communicator& pp, const StagePlan& plan, const Schedule& schedule);

  // Runs every action of this stage for one optimizer step. Returns the sum
  // of the losses this stage computed (the head stage's; 0 elsewhere).
  double run(PipelineStage& stage);
  // Milliseconds this stage waited for its neighbours in the last run.
  double bubble_ms() const { return bubble_ms_; }

 private:
  struct Transfer {
    bool needed = false;
    real* buffer = nullptr;
    std::size_t count = 0;
    int peer = 0, tag = 0;
  };
  // The message an action receives before it runs, or sends after.
  Transfer incoming(PipelineStage& stage, const PipelineAction& a);
  int tag(int chunk, int micro_batch, bool gradient) const;

  Communicator& pp_;
  StagePlan plan_;
  std::vector<PipelineAction> actions_;
  int micro_batches_;
  double bubble_ms_ = 0;
  struct PendingSend {
    CommRequest request;
    int chunk = -1, micro_batch = -1;  // forward outputs: completed before that record is freed
    View1D buffer;                     // input gradients: the buffer, reused once the send completed
  };
  std::deque<PendingSend> sends_;
  std::vector<View1D> free_buffers_;
};

}  // namespace ndmini
