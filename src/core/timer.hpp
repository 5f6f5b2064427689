// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Wall-clock timing on the host: steady, monotonic, in milliseconds.
#include <chrono>

namespace ndmini {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace ndmini
