// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What the binary is, for `ndmini --version` and `ndmini --build-info`.
#include <string>

namespace ndmini::driver {

// The commit the binary was built from (cmake/git_sha.cmake).
std::string git_sha();

// "ndmini 0.1.0 (GIT_SHA)".
std::string version_text();

// One JSON object: version, git commit, build type, compiler, Kokkos, MPI
// and NCCL, for the provenance of a scaling study (bench/scaling) or a bug report.
std::string build_info();

}  // namespace ndmini::driver
