// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Wall-clock timing on the host: steady, monotonic. The one Clock of ndmini.
#include <chrono>

namespace ndmini {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double ms_since(Clock::time_point t0) { return ms_between(t0, Clock::now()); }

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace ndmini
