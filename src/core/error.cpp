// SPDX-License-Identifier: BSD-3-Clause
#include "core/error.hpp"

namespace ndmini {

void require(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}

}  // namespace ndmini
