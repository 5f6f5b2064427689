// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a checkpoint holds of a run, and the global view of a rank's tensors:
// host copies of this rank's parameter and AdamW shards, and the slabs that
// name each of its blocks of the global tensors (io/checkpoint.hpp).
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "parallel/param_store.hpp"
#include "train/optimizer.hpp"

namespace ndmini {

class CheckpointState {
 public:
  CheckpointState(const ModelConfig& m, const ParamStore& store, const AdamW& opt);
  const std::vector<io::TensorSlab>& slabs() const { return slabs_; }
  void from_device(const ParamStore& store, const AdamW& opt);
  void to_device(ParamStore& store, const AdamW& opt);

 private:
  View1D::HostMirror params_, exp_avg_, exp_avg_sq_;
  std::vector<io::TensorSlab> slabs_;
};

// Every global tensor assembled on every rank from the owners' blocks of
// `buffer` (this rank's parameter or gradient shard): zeros plus one owner
// per element, so the sum over `world` is exact. For comparing layouts (tests).
std::map<std::string, std::vector<float>> gather_global(const ModelConfig& m, const ParamStore& store,
                                                        const View1D& buffer, MPI_Comm world);

// A resumed run must train the same model on the same data stream: throws
// Error naming the first key that differs from the checkpoint's deck.
void check_resume_compatible(const Config& cfg, const io::CheckpointInfo& info, const std::string& where);

}  // namespace ndmini
