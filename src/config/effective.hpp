// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The effective configuration: every key of the schema (config.hpp) with its
// value in a Config, defaults included, as a checkpoint stores it and as a
// resume compares it with the deck's.
#include <string>
#include <vector>

#include "config/config.hpp"

namespace ndmini {

struct KeyValue {
  std::string key;    // "train.lr"
  std::string value;  // as TOML text: "0.003", "\"fp32\""
};

// Every key in the schema's order.
std::vector<KeyValue> key_values(const Config& cfg);

// Every key as a TOML deck that parse_config reads back to the same values.
std::string effective_toml(const Config& cfg);

// `ndmini config`: effective_toml of `resolved` (the deck with its -1 degrees
// filled), each key followed by where its value came from: `# default`,
// `# deck`, `# --set` (from cfg.key_origin), and `(-1, resolved)` where the
// layout filled it.
std::string effective_toml_with_origins(const Config& cfg, const Config& resolved);

}  // namespace ndmini
