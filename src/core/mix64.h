// splitmix64's finalizer: a 64-bit value to a well-mixed 64-bit value (counter-based random
// streams: synth weights, benchmark prompts).
#pragma once

#include <cstdint>

namespace smolrt {

inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace smolrt
