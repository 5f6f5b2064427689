// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/pipeline/pipeline.hpp"

#include <chrono>

namespace ndmini {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// MPI guarantees tags up to 32767 at least; beyond that the tags repeat,
// which stays correct because MPI matches messages between a pair in order.
constexpr int kTagSpace = 32768;

}  // namespace

PipelineRunner::PipelineRunner(Communicator& pp, const StagePlan& plan, const Schedule& schedule)
    : pp_(pp), plan_(plan), actions_(schedule.actions(pp.rank())), micro_batches_(schedule.micro_batches()) {}

// Named by the edge it travels: the activation INTO chunk j, the gradient FROM chunk j.
int PipelineRunner::tag(int chunk, int micro_batch, bool gradient) const {
  return (2 * (chunk + plan_.chunks() * micro_batch) + (gradient ? 1 : 0)) % kTagSpace;
}

PipelineRunner::Transfer PipelineRunner::incoming(PipelineStage& stage, const PipelineAction& a) {
  Transfer t;
  const std::size_t n = stage.activation_elements();
  if (a.kind == PipelineAction::Kind::forward && a.chunk > 0)
    t = {true, stage.input_buffer(a.chunk, a.micro_batch), n, plan_.rank_of(a.chunk - 1),
         tag(a.chunk, a.micro_batch, false)};
  if (a.kind == PipelineAction::Kind::backward && a.chunk + 1 < plan_.chunks())
    t = {true, stage.output_grad_buffer(a.chunk, a.micro_batch), n, plan_.rank_of(a.chunk + 1),
         tag(a.chunk + 1, a.micro_batch, true)};
  return t;
}

double PipelineRunner::run(PipelineStage& stage) {
  bubble_ms_ = 0;
  double loss = 0;
  const std::size_t n = stage.activation_elements();
  auto post = [&](std::size_t i) {
    const Transfer t = incoming(stage, actions_[i]);
    return t.needed ? pp_.irecv(t.buffer, t.count, t.peer, t.tag) : CommRequest();
  };
  // Completed sends give their buffers back; forward sends just end.
  auto reap = [&](bool all) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (all) it->request.wait();
      if (it->request.active() && !it->request.test()) {
        ++it;
        continue;
      }
      if (it->buffer.extent(0) > 0) free_buffers_.push_back(it->buffer);
      it = sends_.erase(it);
    }
  };

  CommRequest next = actions_.empty() ? CommRequest() : post(0);
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction a = actions_[i];
    const auto t0 = Clock::now();
    next.wait();
    bubble_ms_ += ms_since(t0);
    if (i + 1 < actions_.size()) next = post(i + 1);
    const bool last = a.micro_batch + 1 == micro_batches_;
    if (a.kind == PipelineAction::Kind::forward) {
      loss += stage.forward(a.chunk, a.micro_batch, last);
      if (a.chunk + 1 < plan_.chunks())
        sends_.push_back({pp_.isend(stage.output(a.chunk, a.micro_batch), n, plan_.rank_of(a.chunk + 1),
                                    tag(a.chunk + 1, a.micro_batch, false)),
                          a.chunk, a.micro_batch, View1D()});
    } else {
      // The forward output of this record must be gone before backward frees it.
      for (auto& s : sends_)
        if (s.chunk == a.chunk && s.micro_batch == a.micro_batch) s.request.wait();
      View1D grad;
      if (a.chunk > 0) {
        if (free_buffers_.empty()) {
          grad = View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ndmini::pipeline_grad"), n);
        } else {
          grad = free_buffers_.back();
          free_buffers_.pop_back();
        }
      }
      stage.backward(a.chunk, a.micro_batch, grad.data(), last);
      if (a.chunk > 0)
        sends_.push_back(
            {pp_.isend(grad.data(), n, plan_.rank_of(a.chunk - 1), tag(a.chunk, a.micro_batch, true)), -1, -1, grad});
    }
    reap(false);
  }
  reap(true);
  return loss;
}

}  // namespace ndmini
