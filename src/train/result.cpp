// SPDX-License-Identifier: BSD-3-Clause
#include "train/result.hpp"

#include <algorithm>

namespace ndmini {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double StepStats::exposed_comm_ms() const {
  double total = 0;
  for (const auto& [name, s] : comm) total += s.exposed_ms;
  return total;
}

std::optional<double> TrainResult::final_loss() const {
  return losses.empty() ? std::nullopt : std::optional(losses.back());
}

double TrainResult::median_bubble_ms(int stage) const {
  std::vector<double> b;
  for (const StepStats& s : timed) b.push_back(s.bubble_ms[stage]);
  return median(b);
}

}  // namespace ndmini
