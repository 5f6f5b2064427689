// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Whether a deck asks ndmini plan to search: its five parallel degrees all
// 0. The deck parser refuses a degree of 0 (nothing can train with it), so
// this reads the TOML itself, with the --set overrides on top.
#include <string>
#include <vector>

namespace ndmini {

// `text`: the deck; `overrides`: "section.key=value" strings, applied in order.
bool deck_asks_for_search(const std::string& text, const std::vector<std::string>& overrides);

// The overrides that make a search deck parse: every degree 1 (the search sets them).
std::vector<std::string> with_degrees_set(std::vector<std::string> overrides);

}  // namespace ndmini
