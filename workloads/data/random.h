// Counter-based random numbers for the data sources: a sample's stream is seeded by hashing (seed, step, index),
// so any sample can be produced on its own, in any process, in any order.
#pragma once

#include <cstdint>

namespace emu::data {

// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A SplitMix64 stream whose start depends on every key.
class SampleRandom {
 public:
  constexpr SampleRandom(uint64_t seed, uint64_t a, uint64_t b = 0) : state_(mix64(mix64(mix64(seed) ^ a) ^ b)) {}

  constexpr uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }
  // Uniform in [0, bound), bound > 0; the modulo bias is below bound / 2^64.
  constexpr uint64_t below(uint64_t bound) { return next() % bound; }
  // Uniform in [0, 1) with 53 random bits.
  constexpr double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace emu::data
