// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The deck reference, docs/deck.md: every key of the parser's schema with its
// type and default, beside the meaning written in deck_reference.cpp.
#include <string>

namespace ndmini {

// The whole of docs/deck.md. Throws ndmini::Error when a key of the schema has
// no meaning written, or a meaning names a key the schema does not have.
std::string deck_reference_markdown();

// `ndmini keys`: the same sections, keys, types, defaults and meanings as
// plain text, one key a line.
std::string deck_keys_text();

}  // namespace ndmini
