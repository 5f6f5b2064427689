// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ndmini plan --fit: the two efficiencies of a cluster file fitted to the
// metrics of training runs that were predicted on it (perf.cluster; each
// summary carries its prediction by part beside what was measured,
// docs/output.md#metrics). docs/planner.md has the equations.
#include <string>
#include <vector>

namespace ndmini {

struct FitRequest {
  std::vector<std::string> metrics;  // --fit FILE ...: metrics files of finished runs
  std::string cluster;               // the cluster file the runs were predicted on
  std::string out;                   // write the refitted cluster file here; empty: print only
};

// The report: each constant before and after, and each run's step measured,
// predicted before and after. Throws Error naming the file for a metrics
// file without a summary, without a prediction, or predicted on another
// cluster file, and when no run has the part a constant is fitted to.
std::string run_fit(const FitRequest& request);

}  // namespace ndmini
