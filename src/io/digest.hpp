// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The hashes of the checkpoint format (and of the data provenance record).
// Not cryptographic: they detect corruption (bit flips, truncation, blocks in
// the wrong place), not forgery.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ndmini::io {

// SplitMix64's output function: its finalizer on x + golden gamma, a
// bijection with no fixed point at 0. (rng::mix64 is the finalizer alone.)
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Order-dependent hash of a byte stream: a splitmix64 chain over 8-byte
// little-endian words (the tail zero-padded), finished with the length.
class StreamHash {
 public:
  void update(const void* data, std::size_t n);
  std::uint64_t finish() const;

 private:
  std::uint64_t h_ = 0;
  std::uint64_t length_ = 0;
  unsigned char word_[8] = {};
  std::size_t fill_ = 0;
};

std::uint64_t hash_bytes(const void* data, std::size_t n);

// Layout-independent digest of float32 elements: the sum (mod 2^64) over
// elements of splitmix64(rotl(global index, 32) ^ bits(x)), where the global index
// is the element's row-major position in its tensor. Summing the digests of
// disjoint blocks gives the digest of their union, so ranks holding any split
// of a tensor agree on one value; changing any single element changes it
// (splitmix64 is a bijection). `count` elements at `x`, the first at `first_index`.
std::uint64_t element_digest(const float* x, std::uint64_t count, std::uint64_t first_index);

// "00ab..." (16 lowercase hex digits), and back (nullopt-like: false on bad text).
std::string hex64(std::uint64_t v);
bool parse_hex64(const std::string& text, std::uint64_t& out);

}  // namespace ndmini::io
