// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/context.hpp"

namespace ndmini {

ParallelContext::ParallelContext(const ParallelDims& dims, MPI_Comm world, bool moe) : mesh_(dims, world) {
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
  if (mesh_.expert() != MPI_COMM_NULL) experts_ = std::make_unique<Communicator>(mesh_.expert(), "ep", device);
  if (moe) expert_fsdp_ = std::make_unique<Communicator>(mesh_.expert_fsdp(), "efsdp", device);
}

std::vector<ParallelContext::Reported> ParallelContext::reported() const {
  const ParallelDims& d = dims();
  std::vector<Reported> out = {{dp_replicate_->name().c_str(), dp_replicate_.get(), d.dp_replicate},
                               {fsdp_->name().c_str(), fsdp_.get(), d.fsdp()},
                               {tp_->name().c_str(), tp_.get(), d.tp},
                               {cp_->name().c_str(), cp_.get(), d.cp},
                               {pp_->name().c_str(), pp_.get(), d.pp}};
  if (d.pp > 1) out.push_back({"tied_wte", tied_.get(), 2});                        // the first and the last stage
  if (d.ep > 1) out.push_back({"ep", experts_.get(), d.ep});                        // the MoE blocks' all-to-all
  if (expert_fsdp_) out.push_back({"efsdp", expert_fsdp_.get(), d.expert_fsdp()});  // the routed experts' FSDP
  out.push_back({"batch", batch_.get(), d.batch()});
  out.push_back({"norm", norm_.get(), d.norm()});
  return out;
}

ParallelContext::Reported ParallelContext::group(const std::string& name) const {
  for (const Reported& r : reported())
    if (name == r.name) return r;
  return {"", nullptr, 0};
}

int ParallelContext::data_parallel_index() const {
  return mesh_.coord(Axis::dp_replicate) * mesh_.degree(Axis::dp_shard) + mesh_.coord(Axis::dp_shard);
}

}  // namespace ndmini
