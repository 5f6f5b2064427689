// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Every communicator of the mesh, owned in one place. There is one per axis
// the model splits over (tp, cp, pp, dp_replicate) and one for the fsdp group
// (dp_shard x cp, accounted as "fsdp"). Two more carry the scalar reductions
// ("batch" sums the loss, "norm" the gradient norm), and one the tied
// embedding's pair of pipeline ends, and with ep > 1 one the MoE blocks'
// expert group ("ep": their all-to-all). A model with MoE blocks has one
// more, the expert fsdp group ("efsdp": the routed experts' gathers and
// reduce-scatters). The mesh (mesh/mesh.hpp) defines which ranks each one holds.
//
// Backends: device buffers go through NCCL where the build has it, host
// buffers through MPI; the scalar groups and the pipeline (whose sends must
// not block, see parallel/pipeline/pipeline.hpp) always use MPI.
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "mesh/mesh.hpp"

namespace ndmini {

class ParallelContext {
 public:
  // Collective over `world`: builds the Cartesian mesh and every
  // communicator (`moe`: the model has MoE blocks).
  ParallelContext(const ParallelDims& dims, MPI_Comm world, bool moe = false);
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  const Mesh& mesh() const { return mesh_; }
  const ParallelDims& dims() const { return mesh_.dims(); }
  int rank() const { return mesh_.rank(); }
  int degree(Axis a) const { return mesh_.degree(a); }
  int coord(Axis a) const { return mesh_.coord(a); }

  Communicator& tp() { return *tp_; }
  Communicator& cp() { return *cp_; }
  Communicator& pp() { return *pp_; }
  Communicator& dp_replicate() { return *dp_replicate_; }
  Communicator& fsdp() { return *fsdp_; }
  Communicator& batch() { return *batch_; }
  Communicator& norm() { return *norm_; }
  // The first and last pipeline stage of this pipeline; null elsewhere and when pp = 1.
  Communicator* tied_embedding() { return tied_.get(); }
  // The expert group of the MoE blocks (mesh/dims.hpp); null when ep = 1.
  Communicator* experts() { return experts_.get(); }
  // The routed experts' FSDP group (mesh/dims.hpp); null without MoE blocks.
  Communicator* expert_fsdp() { return expert_fsdp_.get(); }

  // Every group whose traffic a step reports, in report order; the same
  // names and sizes on every rank (the tied pair, when pp > 1, is null on
  // middle stages). The size is the group's, from the mesh's degrees.
  struct Reported {
    const char* name;
    Communicator* comm;
    int size;
  };
  std::vector<Reported> reported() const;
  // The reported group named `name` ("tp", "fsdp", ...); a null comm where
  // this rank is not in it (the tied pair on a middle stage), size 0 where
  // the layout has no such group.
  Reported group(const std::string& name) const;

  // Data parallelism: this rank's index among the dp_replicate x dp_shard
  // ranks that take distinct sequences of the global batch.
  int data_parallel_index() const;

 private:
  Mesh mesh_;
  std::unique_ptr<Communicator> tp_, cp_, pp_, dp_replicate_, fsdp_, batch_, norm_, tied_, experts_, expert_fsdp_;
};

}  // namespace ndmini
