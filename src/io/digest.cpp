// SPDX-License-Identifier: BSD-3-Clause
#include "io/digest.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ndmini::io {

void StreamHash::update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  length_ += n;
  while (n > 0) {
    if (fill_ == 0 && n >= 8) {  // fast path: whole words straight from the input
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      h_ = splitmix64(h_ ^ w);
      p += 8;
      n -= 8;
      continue;
    }
    const std::size_t take = std::min(n, std::size_t{8} - fill_);
    std::memcpy(word_ + fill_, p, take);
    fill_ += take;
    p += take;
    n -= take;
    if (fill_ == 8) {
      std::uint64_t w;
      std::memcpy(&w, word_, 8);
      h_ = splitmix64(h_ ^ w);
      fill_ = 0;
    }
  }
}

std::uint64_t StreamHash::finish() const {
  std::uint64_t h = h_;
  if (fill_ > 0) {
    unsigned char last[8] = {};
    std::memcpy(last, word_, fill_);
    std::uint64_t w;
    std::memcpy(&w, last, 8);
    h = splitmix64(h ^ w);
  }
  return splitmix64(h ^ length_);
}

std::uint64_t hash_bytes(const void* data, std::size_t n) {
  StreamHash h;
  h.update(data, n);
  return h.finish();
}

std::uint64_t element_digest(const float* x, std::uint64_t count, std::uint64_t first_index) {
  // One splitmix64 per element (the rotation keeps the index and the 32 value bits
  // apart for tensors below 2^32 elements); the loop has no dependency but the
  // sum, so the compiler vectorizes it.
  std::uint64_t sum = 0;
  for (std::uint64_t j = 0; j < count; ++j) {
    std::uint32_t bits;
    std::memcpy(&bits, x + j, sizeof bits);
    const std::uint64_t i = first_index + j;
    sum += splitmix64(((i << 32) | (i >> 32)) ^ bits);
  }
  return sum;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool parse_hex64(const std::string& text, std::uint64_t& out) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  out = std::strtoull(text.c_str(), nullptr, 16);
  return true;
}

}  // namespace ndmini::io
