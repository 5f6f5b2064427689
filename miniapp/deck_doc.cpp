// SPDX-License-Identifier: BSD-3-Clause
// ndmini_deck_doc: prints docs/deck.md, the deck reference generated from the
// parser's schema; with --check FILE, exits 1 when FILE differs from it (the
// `deck_doc` test), so the page cannot drift from the parser.
//   build/miniapp/ndmini_deck_doc > docs/deck.md
//   build/miniapp/ndmini_deck_doc --check docs/deck.md
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "config/deck_reference.hpp"
#include "core/error.hpp"

namespace {

constexpr const char* kRegenerate =
    "regenerate it: cmake --build build --target ndmini_deck_doc && build/miniapp/ndmini_deck_doc > docs/deck.md";

// The first line where `a` and `b` differ, counted from 1.
int first_different_line(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(sa, la));
    const bool more_b = static_cast<bool>(std::getline(sb, lb));
    if (!more_a && !more_b) return line;
    if (more_a != more_b || la != lb) return line;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: ndmini_deck_doc [--check FILE]";
  const bool check = argc == 3 && std::string(argv[1]) == "--check";
  if (argc != 1 && !check) {
    std::fprintf(stderr, "ndmini: error: %s\n", usage.c_str());
    return 2;
  }
  try {
    const std::string page = ndmini::deck_reference_markdown();
    if (!check) {
      std::cout << page;
      return 0;
    }
    const std::string path = argv[2];
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "ndmini: error: cannot read %s; %s\n", path.c_str(), kRegenerate);
      return 1;
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str() != page) {
      std::fprintf(stderr, "ndmini: error: %s differs from the deck parser's schema (first at line %d); %s\n",
                   path.c_str(), first_different_line(text.str(), page), kRegenerate);
      return 1;
    }
    std::printf("%s matches the deck parser's schema\n", path.c_str());
    return 0;
  } catch (const ndmini::Error& e) {
    std::fprintf(stderr, "ndmini: error: %s\n", e.what());
    return 1;
  }
}
