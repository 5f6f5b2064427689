// SPDX-License-Identifier: BSD-3-Clause
#include "io/raw_file.hpp"

namespace ndmini::io::detail {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  std::string s(text, static_cast<std::size_t>(n));
  const auto line = s.find_last_of('\n');
  if (line != std::string::npos) s = s.substr(line + 1);
  const auto origin = s.find("): ");
  if (origin != std::string::npos) s = s.substr(origin + 3);
  return s;
}

}  // namespace ndmini::io::detail
