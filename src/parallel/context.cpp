// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/context.hpp"

namespace ndmini {

ParallelContext::ParallelContext(const MeshShape& shape, MPI_Comm world) : mesh_(shape, world) {
  const auto device = device_collectives_backend(world);
  tp_ = std::make_unique<Communicator>(mesh_.axis(Axis::tp), "tp", device);
  cp_ = std::make_unique<Communicator>(mesh_.axis(Axis::cp), "cp", device);
  // Pipeline sends must not block, and NCCL's pairing of a send with its
  // receive deadlocks interleaved 1F1B (parallel/pipeline/pipeline.hpp): MPI
  // always; device buffers go through a CUDA-aware MPI or host memory
  // (comm/device_path.hpp).
  pp_ = std::make_unique<Communicator>(mesh_.axis(Axis::pp), "pp", Communicator::Backend::mpi);
  dp_replicate_ = std::make_unique<Communicator>(mesh_.axis(Axis::dp_replicate), "dp_replicate", device);
  fsdp_ = std::make_unique<Communicator>(mesh_.fsdp(), "fsdp", device);
  batch_ = std::make_unique<Communicator>(mesh_.batch(), "batch");
  norm_ = std::make_unique<Communicator>(mesh_.norm(), "norm");
  if (mesh_.pipeline_ends() != MPI_COMM_NULL)
    tied_ = std::make_unique<Communicator>(mesh_.pipeline_ends(), "tied_wte", device);
}

std::vector<ParallelContext::Reported> ParallelContext::reported() {
  std::vector<Reported> out;
  for (Communicator* c : {dp_replicate_.get(), fsdp_.get(), tp_.get(), cp_.get(), pp_.get()})
    out.push_back({c->name().c_str(), c});
  if (mesh_.degree(Axis::pp) > 1) out.push_back({"tied_wte", tied_.get()});
  out.push_back({"batch", batch_.get()});
  out.push_back({"norm", norm_.get()});
  return out;
}

int ParallelContext::data_parallel_index() const {
  return mesh_.coord(Axis::dp_replicate) * mesh_.degree(Axis::dp_shard) + mesh_.coord(Axis::dp_shard);
}

}  // namespace ndmini
