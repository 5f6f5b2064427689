// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Wall-clock timing on the host: steady, monotonic. The one Clock of ndmini.
// (And the calling thread's CPU time, for work that runs on that thread alone.)
#include <time.h>

#include <chrono>

namespace ndmini {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double ms_since(Clock::time_point t0) { return ms_between(t0, Clock::now()); }

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds the calling thread has run: unlike the wall clock, not
// lengthened by other processes sharing its core.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace ndmini
