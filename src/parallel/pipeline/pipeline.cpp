// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/pipeline/pipeline.hpp"

#include "core/error.hpp"
#include "core/profiling.hpp"
#include "core/timer.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

// MPI guarantees tags up to 32767 at least; beyond that the tags repeat,
// which stays correct because MPI matches messages between a pair in order.
constexpr int kTagSpace = 32768;

// Float slots of n bf16 values on the wire (an odd n pads one value).
std::size_t wire_slots(std::size_t n) { return (n + 1) / 2; }

}  // namespace

PipelineRunner::PipelineRunner(Communicator& pp, const StagePlan& plan, const Schedule& schedule, bool bf16)
    : pp_(pp),
      plan_(plan),
      actions_(schedule.actions(pp.rank())),
      micro_batches_(schedule.micro_batches()),
      max_in_flight_(std::max(1, schedule.max_in_flight(pp.rank()))),
      bf16_(bf16) {
  if (pp.backend() != Communicator::Backend::mpi)
    throw InternalError("the pipeline's sends must not block (an MPI pp group; see pipeline.hpp)");
}

// Named by the edge it travels: the activation INTO chunk j, the gradient FROM chunk j.
int PipelineRunner::tag(int chunk, int micro_batch, bool gradient) const {
  return (2 * (chunk + plan_.chunks() * micro_batch) + (gradient ? 1 : 0)) % kTagSpace;
}

PipelineRunner::Transfer PipelineRunner::incoming(PipelineStage& stage, const PipelineAction& a) {
  if (a.kind == PipelineAction::Kind::forward && a.chunk > 0)
    return {true, stage.input_buffer(a.chunk, a.micro_batch), plan_.rank_of(a.chunk - 1),
            tag(a.chunk, a.micro_batch, false)};
  if (a.kind == PipelineAction::Kind::backward && a.chunk + 1 < plan_.chunks())
    return {true, stage.output_grad_buffer(a.chunk, a.micro_batch), plan_.rank_of(a.chunk + 1),
            tag(a.chunk + 1, a.micro_batch, true)};
  return {};
}

PipelineRunner::Transfer PipelineRunner::outgoing(PipelineStage& stage, const PipelineAction& a, real* input_grad) {
  if (a.kind == PipelineAction::Kind::forward && a.chunk + 1 < plan_.chunks())
    return {true, const_cast<real*>(stage.output(a.chunk, a.micro_batch)), plan_.rank_of(a.chunk + 1),
            tag(a.chunk + 1, a.micro_batch, false)};
  if (a.kind == PipelineAction::Kind::backward && a.chunk > 0)
    return {true, input_grad, plan_.rank_of(a.chunk - 1), tag(a.chunk, a.micro_batch, true)};
  return {};
}

std::size_t PipelineRunner::most_grad_buffers(const StagePlan& plan, int stage, int micro_batches) {
  std::size_t chunks = 0;
  for (const Chunk& c : plan.chunks_of(stage)) chunks += c.index > 0;
  return chunks * micro_batches;
}

std::size_t PipelineRunner::most_buffer_bytes(const StagePlan& plan, int stage, int micro_batches, int max_in_flight,
                                              std::size_t activation, bool bf16_wire) {
  const double grads = static_cast<double>(most_grad_buffers(plan, stage, micro_batches));
  // Named bf16_wire, not bf16: a parameter of that name hid the type, and sizeof(bf16) was a bool's
  // 1 byte, half a wire buffer's element.
  const double bytes = bf16_wire ? activation * sizeof(real) + (grads + std::max(1, max_in_flight) + 1) * 2 *
                                                                   wire_slots(activation) * sizeof(ndmini::bf16)
                                 : grads * activation * sizeof(real);
  return static_cast<std::size_t>(std::min(9.0e18, bytes));
}

CommRequest PipelineRunner::send_values(PendingSend& send, const real* values, std::size_t n, int peer, int tag) {
  if (!bf16_) return pp_.isend(values, n, peer, tag);
  if (free_wires_.empty()) {
    send.wire = Bf16View1D("ndmini::pipeline_wire", 2 * wire_slots(n));  // zeroed: a padding value is 0
  } else {
    send.wire = free_wires_.back();
    free_wires_.pop_back();
  }
  kernels::round_to_bf16(Bf16Slice1D(send.wire.data(), n), ConstSlice1D(values, n));
  return pp_.isend(reinterpret_cast<const real*>(send.wire.data()), wire_slots(n), peer, tag);
}

void PipelineRunner::receive(real* values, std::size_t n, int peer, int tag, bool timed) {
  if (bf16_ && receive_wire_.extent(0) == 0) receive_wire_ = Bf16View1D("ndmini::pipeline_receive", 2 * wire_slots(n));
  CommRequest recv = bf16_ ? pp_.irecv(reinterpret_cast<real*>(receive_wire_.data()), wire_slots(n), peer, tag)
                           : pp_.irecv(values, n, peer, tag);
  const auto t0 = Clock::now();
  recv.wait();
  if (timed) bubble_ms_ += ms_since(t0);
  if (bf16_) kernels::widen_bf16(Slice1D(values, n), ConstBf16Slice1D(receive_wire_.data(), n));
}

View1D PipelineRunner::grad_buffer(std::size_t n) {
  if (free_buffers_.empty()) return View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ndmini::pipeline_grad"), n);
  View1D b = free_buffers_.back();
  free_buffers_.pop_back();
  return b;
}

double PipelineRunner::run(PipelineStage& stage) {
  using Kind = PipelineAction::Kind;
  bubble_ms_ = 0;
  double loss = 0;
  const std::size_t n = stage.activation_elements();
  // Completed sends give their buffers back.
  auto reap = [&](bool all) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (all) it->request.wait();
      if (it->request.active() && !it->request.test()) {
        ++it;
        continue;
      }
      if (it->buffer.extent(0) > 0) free_buffers_.push_back(it->buffer);
      if (it->wire.extent(0) > 0) free_wires_.push_back(it->wire);
      it = sends_.erase(it);
    }
  };

  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction a = actions_[i];
    // Posted only now, after the previous action: a backward has freed its
    // record before the next forward's record is made.
    const Transfer in = incoming(stage, a);
    if (in.needed) {
      const ProfileRegion region(a.kind == Kind::forward ? "ndmini::pipeline wait for the previous stage"
                                                         : "ndmini::pipeline wait for the next stage");
      // Timed from after the issue: issuing fences this stage's own kernels,
      // which are compute, not waiting for a neighbour.
      receive(in.buffer, n, in.peer, in.tag, true);
    }
    const bool last = a.micro_batch + 1 == micro_batches_;
    View1D grad;
    if (a.kind == Kind::forward) {
      loss += stage.forward(a.chunk, a.micro_batch, last);
    } else {
      // The forward output of this record must be gone before backward frees it.
      for (auto& s : sends_)
        if (s.chunk == a.chunk && s.micro_batch == a.micro_batch) s.request.wait();
      if (a.chunk > 0) grad = grad_buffer(n);
      stage.backward(a.chunk, a.micro_batch, grad.data(), last);
    }
    const Transfer out = outgoing(stage, a, grad.data());
    if (out.needed) {
      PendingSend send;
      if (a.kind == Kind::forward) {
        send.chunk = a.chunk;
        send.micro_batch = a.micro_batch;
      }
      send.request = send_values(send, out.buffer, n, out.peer, out.tag);
      // fp32: the input gradient itself is on the wire; bf16: its rounded copy is, so it can be reused at once.
      if (bf16_ && grad.extent(0) > 0)
        free_buffers_.push_back(grad);
      else
        send.buffer = grad;
      sends_.push_back(std::move(send));
    }
    reap(false);
  }
  {
    const ProfileRegion region("ndmini::pipeline wait for the last sends");
    reap(true);
  }
  return loss;
}

double PipelineRunner::evaluate(PipelineStage& stage, int micro_batches) {
  double loss = 0;
  const std::size_t n = stage.activation_elements();
  const std::vector<Chunk> chunks = plan_.chunks_of(pp_.rank());
  // Sends of forward outputs in flight, oldest first; each holds its record.
  std::deque<PendingSend> sends;
  auto complete_front = [&] {
    if (sends.front().wire.extent(0) > 0) free_wires_.push_back(sends.front().wire);
    stage.discard(sends.front().chunk, sends.front().micro_batch);
    sends.pop_front();
  };
  auto complete_oldest = [&] {
    sends.front().request.wait();
    complete_front();
  };
  for (int mb = 0; mb < micro_batches; ++mb)
    for (const Chunk& c : chunks) {
      // Memory as in training: a new record only while fewer than the
      // schedule's most are held (waiting for a send waits for a receive the
      // peer posts at an earlier action, so it always completes).
      while (static_cast<int>(sends.size()) >= max_in_flight_) complete_oldest();
      if (c.index > 0) {
        const ProfileRegion region("ndmini::pipeline wait for the previous stage");
        receive(stage.input_buffer(c.index, mb), n, plan_.rank_of(c.index - 1), tag(c.index, mb, false), false);
      }
      loss += stage.forward(c.index, mb, false);
      if (c.index + 1 < plan_.chunks()) {
        PendingSend send;
        send.chunk = c.index;
        send.micro_batch = mb;
        send.request =
            send_values(send, stage.output(c.index, mb), n, plan_.rank_of(c.index + 1), tag(c.index + 1, mb, false));
        sends.push_back(std::move(send));
      } else {
        stage.discard(c.index, mb);
      }
      // Records whose sends are done go at once.
      while (!sends.empty() && (!sends.front().request.active() || sends.front().request.test())) complete_front();
    }
  const ProfileRegion region("ndmini::pipeline wait for the last sends");
  while (!sends.empty()) complete_oldest();
  return loss;
}

}  // namespace ndmini
