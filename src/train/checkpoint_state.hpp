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

// Where an async save's copy of the state lives: page-locked host memory on a
// GPU build (the copy from the device runs at full link speed), plain host
// memory otherwise.
#ifdef KOKKOS_ENABLE_CUDA
using CheckpointStagingSpace = Kokkos::CudaHostPinnedSpace;
#else
using CheckpointStagingSpace = HostSpace;
#endif

class CheckpointState {
 public:
  // `staged`: the host copies are buffers of their own (checkpoint.async),
  // so training may change the state while a background thread writes the
  // copy; else they are Kokkos host mirrors, which on a host build are the
  // state itself (nothing copied).
  CheckpointState(const ModelConfig& m, const ParamStore& store, const AdamW& opt, bool staged = false);
  const std::vector<io::TensorSlab>& slabs() const { return slabs_; }
  void from_device(const ParamStore& store, const AdamW& opt);
  void to_device(ParamStore& store, const AdamW& opt);
  // Bytes of the staged copies (0 when not staged): the memory checkpoint.async
  // costs, three fp32 shards (MemoryEstimate::async_checkpoint_bytes).
  std::size_t staged_bytes() const;

 private:
  using StagingView = Kokkos::View<real*, Kokkos::LayoutRight, CheckpointStagingSpace>;
  View1D::HostMirror params_, exp_avg_, exp_avg_sq_;  // not staged
  StagingView staged_params_, staged_exp_avg_, staged_exp_avg_sq_;
  bool staged_ = false;
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
