// SPDX-License-Identifier: BSD-3-Clause
#include "layers/grad_reduction.hpp"

#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

// The gradients rounded to bf16, in a buffer of their own.
Bf16View1D rounded(const real* grads, std::size_t n) {
  Bf16View1D wire = uninitialized_bf16("ndmini::grads_bf16", n);
  kernels::round_to_bf16(wire, ConstSlice1D(grads, n));
  return wire;
}

}  // namespace

void all_reduce_grads(Communicator& group, real* grads, std::size_t n, Precision wire) {
  if (wire == Precision::fp32) {
    group.all_reduce(grads, n);
    return;
  }
  const Bf16View1D sum = rounded(grads, n);
  group.all_reduce(sum.data(), n);
  kernels::widen_bf16(Slice1D(grads, n), sum);
}

GradAllReduce::GradAllReduce(Communicator& group, real* grads, std::size_t n, Precision wire) : grads_(grads) {
  if (wire == Precision::fp32) {
    request_ = group.iall_reduce(grads, n);
    return;
  }
  wire_ = rounded(grads, n);
  request_ = group.iall_reduce(wire_.data(), n);
}

void GradAllReduce::poll() {
  if (request_.active()) request_.test();
}

void GradAllReduce::finish() {
  request_.wait();
  if (wire_.extent(0) == 0) return;
  kernels::widen_bf16(Slice1D(grads_, wire_.extent(0)), wire_);
  wire_ = Bf16View1D();
}

}  // namespace ndmini
