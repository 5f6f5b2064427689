// SPDX-License-Identifier: BSD-3-Clause
#include "plan/search_request.hpp"

#include <toml++/toml.h>

namespace ndmini {
namespace {

constexpr const char* kDegrees[] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

}  // namespace

bool deck_asks_for_search(const std::string& text, const std::vector<std::string>& overrides) {
  toml::table deck;
  try {
    deck = toml::parse(text);
  } catch (const toml::parse_error&) {
    return false;  // the deck parser says what is wrong
  }
  for (const char* name : kDegrees) {
    std::string value = std::to_string(deck.at_path(std::string("parallel.") + name).value_or(std::int64_t{1}));
    for (const std::string& o : overrides)
      if (o.rfind(std::string("parallel.") + name + "=", 0) == 0) value = o.substr(o.find('=') + 1);
    if (value != "0") return false;
  }
  return true;
}

std::vector<std::string> with_degrees_set(std::vector<std::string> overrides) {
  for (const char* name : kDegrees) overrides.push_back(std::string("parallel.") + name + "=1");
  return overrides;
}

}  // namespace ndmini
