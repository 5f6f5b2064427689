// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Pipeline parallelism, part 2: runs one optimizer step's schedule on this
// stage, moving activations and their gradients between neighbouring
// stages on the pp communicator.
//
// Before each action the runner waits for what it needs (the previous
// chunk's output before a forward, the next chunk's input gradient before a
// backward): that wait is the pipeline bubble. After the action it sends the
// result. The receive of an action is posted only once the action before it
// is done, so a backward has freed its micro-batch's activations before the
// next forward takes new ones: a stage holds exactly the micro-batches the
// schedule keeps in flight (Schedule::max_in_flight).
//
// Sends are non-blocking: the stage goes on computing and only ever waits for
// its receives, which every schedule survives (tests/test_schedule.cpp
// simulates it). The pp group therefore always uses MPI (a CUDA-aware MPI
// for device memory): NCCL's send and receive block their stream until the
// peer posts its side, and pairing each action's send with the next action's
// receive into one NCCL group -- the obvious fix -- deadlocks interleaved
// 1F1B (stage 0 and 1 each wait for the other's next group); NCCL pipelines
// need Megatron's schedule-specific grouping, which ndmini does not have.
// Messages are tagged by (micro-batch, chunk, direction), and every pipeline
// edge carries them in the order its receiver posts them.
//
// Progress: MPI moves a large (rendezvous) message only inside MPI calls, so
// its transfer happens while the receiver waits; the bubble then includes it.
//
// Under bf16 the activations and their gradients travel in bf16, two values
// to a float slot (half the bytes): the sender rounds into a wire buffer of
// its own, kept until the send completes, and the receiver widens into the
// stage's fp32 buffer, so the residual stream a stage starts from is the
// sender's rounded to bf16.
#include <cstddef>
#include <deque>
#include <vector>

#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "parallel/pipeline/schedule.hpp"

namespace ndmini {

// What the runner needs of the stage's model (see StageRuntime, which the
// training loop adapts to this).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Floats of one activation (and of its gradient) between chunks.
  virtual std::size_t activation_elements() const = 0;
  // Where the input of a forward arrives; creates the micro-batch's record.
  virtual real* input_buffer(int chunk, int micro_batch) = 0;
  // Returns the micro-batch's loss sum on the head chunk, 0 elsewhere.
  virtual double forward(int chunk, int micro_batch, bool last_micro_batch) = 0;
  // The forward's output; valid until the backward of the same micro-batch.
  virtual const real* output(int chunk, int micro_batch) = 0;
  // Where the gradient of that output arrives before the backward.
  virtual real* output_grad_buffer(int chunk, int micro_batch) = 0;
  // Writes the gradient of the chunk's input to input_grad (not chunk 0) and
  // frees the micro-batch's record.
  virtual void backward(int chunk, int micro_batch, real* input_grad, bool last_micro_batch) = 0;
  // Frees the record of a forward that has no backward (evaluation).
  virtual void discard(int chunk, int micro_batch) = 0;
};

class PipelineRunner {
 public:
  // pp: the pp group, MPI backend (its rank r runs the chunks StagePlan::chunks_of(r)).
  // bf16: the transfers are bf16 on the wire.
  PipelineRunner(Communicator& pp, const StagePlan& plan, const Schedule& schedule, bool bf16 = false);

  // Runs every action of this stage for one optimizer step. Returns the sum
  // of the losses this stage computed (the head stage's; 0 elsewhere).
  double run(PipelineStage& stage);
  // The most buffers of input gradients (activation_elements() floats each)
  // pp rank `stage` holds in a step of `micro_batches`: one per backward of
  // a chunk after the first while its send is in flight (kept for reuse
  // once it completed), so at most one per such backward.
  static std::size_t most_grad_buffers(const StagePlan& plan, int stage, int micro_batches);
  // The most bytes of transfer buffers pp rank `stage` holds in a step
  // (activation: activation_elements()): fp32, the input gradients' buffers
  // above; bf16, one fp32 input gradient (rounded at once), a wire buffer
  // to receive into, and one per send in flight: a forward's until that
  // record's backward (at most max_in_flight) and the input gradients' above.
  static std::size_t most_buffer_bytes(const StagePlan& plan, int stage, int micro_batches, int max_in_flight,
                                       std::size_t activation, bool bf16_wire);

  // Milliseconds this stage waited for its neighbours in the last run.
  double bubble_ms() const { return bubble_ms_; }

  // Forward only, for the validation loss: `micro_batches` micro-batches,
  // each through this stage's chunks in model order, records discarded as
  // soon as their output is sent; no backward, so no gradient is touched.
  // Every stage runs its actions in (micro-batch, chunk) order and every
  // action depends only on an earlier one, so it cannot deadlock; stage r
  // holds at most Schedule::max_in_flight(r) records, as in training.
  // Returns the loss sum this stage computed (the head stage's; 0 elsewhere).
  // Leaves bubble_ms() alone.
  double evaluate(PipelineStage& stage, int micro_batches);

 private:
  struct Transfer {
    bool needed = false;
    real* buffer = nullptr;
    int peer = 0, tag = 0;
  };
  // The message an action receives before it runs, and the one it sends after.
  Transfer incoming(PipelineStage& stage, const PipelineAction& a);
  Transfer outgoing(PipelineStage& stage, const PipelineAction& a, real* input_grad);
  int tag(int chunk, int micro_batch, bool gradient) const;
  View1D grad_buffer(std::size_t n);
  struct PendingSend {
    int chunk = -1, micro_batch = -1;  // forward outputs: completed before that record is freed
    View1D buffer;                     // input gradients (fp32 wire): the buffer, reused once the send completed
    Bf16View1D wire;                   // bf16: the rounded values on the wire, reused likewise
    CommRequest request;               // last: destroyed (and so waited for) before the buffers
  };
  // n activation values to `peer`, from a wire buffer under bf16 (kept in `send`).
  CommRequest send_values(PendingSend& send, const real* values, std::size_t n, int peer, int tag);
  // n activation values from `peer` into `values`; waits, timing the wait as bubble when `timed`.
  void receive(real* values, std::size_t n, int peer, int tag, bool timed);

  Communicator& pp_;
  StagePlan plan_;
  std::vector<PipelineAction> actions_;
  int micro_batches_;
  int max_in_flight_;
  bool bf16_;
  double bubble_ms_ = 0;
  std::deque<PendingSend> sends_;
  std::vector<View1D> free_buffers_;
  std::vector<Bf16View1D> free_wires_;
  Bf16View1D receive_wire_;  // bf16: where a transfer arrives before it is widened
};

}  // namespace ndmini
