// SPDX-License-Identifier: BSD-3-Clause
#include "build_info.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "ndmini_git_sha.hpp"

namespace ndmini::driver {
namespace {

// JSON string literal of s (quotes and backslashes escaped, tabs as spaces, other control characters dropped).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\t') c = ' ';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

}  // namespace

std::string git_sha() { return NDMINI_GIT_SHA; }

std::string version_text() { return std::string("ndmini ") + NDMINI_VERSION + " (" + NDMINI_GIT_SHA + ")"; }

std::string build_info() {
  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(mpi_library, &len);
  MPI_Get_version(&major, &minor);
  std::string mpi(mpi_library, static_cast<std::size_t>(len));
  mpi = mpi.substr(0, mpi.find('\n'));  // MPICH's first line names it; the rest is its configure line
  const std::string nccl = ndmini::nccl_version();
  std::string out = "{";
  out += "\"name\": \"ndmini\", \"version\": " + json_string(NDMINI_VERSION);
  out += ", \"git_sha\": " + json_string(NDMINI_GIT_SHA);
  out += ", \"build_type\": " + json_string(NDMINI_BUILD_TYPE);
  out += ", \"compiler\": " + json_string(NDMINI_COMPILER);
  out += ", \"native\": " + std::string(NDMINI_NATIVE ? "true" : "false");  // -march=native
  out += ", \"kokkos_version\": " +
         json_string(std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                     std::to_string(KOKKOS_VERSION % 100));
  out += ", \"kokkos_backend\": " + json_string(ndmini::ExecSpace::name());
  out += ", \"mpi_library\": " + json_string(mpi);
  out += ", \"mpi_standard\": " + json_string(std::to_string(major) + "." + std::to_string(minor));
  out += ", \"nccl\": " + (nccl.empty() ? std::string("null") : json_string(nccl));
  return out + "}";
}

}  // namespace ndmini::driver
