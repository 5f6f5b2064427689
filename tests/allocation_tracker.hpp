// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Live bytes of Kokkos allocations and their peak, tracked through Kokkos
// Tools' allocation callbacks (not RSS): what the memory estimate is held
// to (test_memory.cpp, test_plan.cpp).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/types.hpp"
#include "train/trainer.hpp"

namespace ndmini::test_support {

// Live bytes of MemSpace allocations made since reset(), their peak, and
// what was live at the peak by label (printed when a check fails).
class AllocationTracker {
 public:
  static AllocationTracker& get() {
    static AllocationTracker t;
    return t;
  }
  void install() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }
  void uninstall() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
  void reset() {
    const std::lock_guard<std::mutex> lock(mutex_);
    live_allocations_.clear();
    live_by_label_.clear();
    peak_by_label_.clear();
    live_ = peak_ = allocations_ = 0;
  }
  std::uint64_t peak() const { return peak_; }
  std::uint64_t allocations() const { return allocations_; }
  std::string peak_breakdown() const {
    std::string out;
    for (const auto& [label, bytes] : peak_by_label_)
      if (bytes > 0) out += "\n  " + label + ": " + std::to_string(bytes) + " bytes";
    return out;
  }

 private:
  // ndmini's Views in MemSpace; not Kokkos' own (a backend's reduction scratch).
  static bool tracked(const Kokkos::Tools::SpaceHandle& space, const char* label) {
    return std::strcmp(space.name, MemSpace::name()) == 0 && std::strncmp(label, "Kokkos::", 8) != 0;
  }
  static void on_allocate(Kokkos::Tools::SpaceHandle space, const char* label, const void* ptr, std::uint64_t size) {
    if (!tracked(space, label)) return;
    AllocationTracker& t = get();
    const std::lock_guard<std::mutex> lock(t.mutex_);
    t.live_allocations_[ptr] = {label, size};
    t.live_by_label_[label] += size;
    t.live_ += size;
    ++t.allocations_;
    if (t.live_ > t.peak_) {
      t.peak_ = t.live_;
      t.peak_by_label_ = t.live_by_label_;
    }
  }
  static void on_deallocate(Kokkos::Tools::SpaceHandle space, const char* label, const void* ptr, std::uint64_t) {
    if (!tracked(space, label)) return;
    AllocationTracker& t = get();
    const std::lock_guard<std::mutex> lock(t.mutex_);
    const auto it = t.live_allocations_.find(ptr);
    if (it == t.live_allocations_.end()) return;  // allocated before reset(): not this run's
    t.live_ -= it->second.second;
    t.live_by_label_[it->second.first] -= it->second.second;
    t.live_allocations_.erase(it);
  }

  std::mutex mutex_;
  std::unordered_map<const void*, std::pair<std::string, std::uint64_t>> live_allocations_;
  std::map<std::string, std::uint64_t> live_by_label_, peak_by_label_;
  std::uint64_t live_ = 0, peak_ = 0, allocations_ = 0;
};

// Trains `cfg` quietly over the world with the tracker counting every
// allocation from a common start on all ranks.
inline TrainResult train_tracked(const Config& cfg, AllocationTracker& tracker) {
  TrainOptions opts;
  opts.quiet = true;
  MPI_Barrier(MPI_COMM_WORLD);
  tracker.reset();
  tracker.install();
  const TrainResult result = train(cfg, opts, MPI_COMM_WORLD);
  tracker.uninstall();
  return result;
}

}  // namespace ndmini::test_support
