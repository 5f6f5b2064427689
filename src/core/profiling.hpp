// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Named regions of a step for Kokkos Tools (space-time-stack, the simple
// kernel timer) and, through the Kokkos nvtx connector, Nsight Systems: the
// forward, recompute and backward of every block, the embedding and the head,
// the optimizer, each collective by group and operation, the pipeline's
// waits for its neighbours and the checkpoints. Names start with "ndmini::".
//
// Without a tool loaded a region costs one branch: names are only built
// when a tool listens.
#include <Kokkos_Core.hpp>
#include <string>
#include <utility>

namespace ndmini {

class ProfileRegion {
 public:
  explicit ProfileRegion(const char* name) : active_(Kokkos::Tools::profileLibraryLoaded()) {
    if (active_) Kokkos::Tools::pushRegion(name);
  }
  // `make_name()` returns the name; called only when a tool listens.
  template <class MakeName, class = decltype(std::string(std::declval<MakeName>()()))>
  explicit ProfileRegion(MakeName&& make_name) : active_(Kokkos::Tools::profileLibraryLoaded()) {
    if (active_) Kokkos::Tools::pushRegion(std::string(make_name()));
  }
  ~ProfileRegion() {
    if (active_) Kokkos::Tools::popRegion();
  }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;

 private:
  bool active_;
};

}  // namespace ndmini
