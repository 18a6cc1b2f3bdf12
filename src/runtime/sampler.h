// The host side of sampling: the seeded PRNG that produces one uniform
// draw per sampled token (so the CPU and GPU backends see the same draws for the same seed), and
// the token history the penalties look at. The pipeline itself is backend/sampling.h.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/cpu/sample.h"
#include "core/sampling.h"

namespace smolrt {

// A seed from std::random_device, for seed == -1.
uint64_t random_seed();

// The draw sequence: std::mt19937_64 (fully specified by the C++ standard, so the same on every
// platform) seeded with `seed`; each draw takes the top 24 bits of one output -> a float in
// [0, 1) with every value exactly representable.
class UniformDraws {
 public:
  explicit UniformDraws(uint64_t seed) : rng_(seed) {}
  float next() { return static_cast<float>(rng_() >> 40) * (1.0f / 16777216.0f); }

 private:
  std::mt19937_64 rng_;
};

// Stateful CPU sampler: params + PRNG + history. Also the source of draws and history for a
// backend that samples on the device (Backend::forward_token_sample): call draw() once per
// sampled token and accept() every token that enters the context.
class TokenSampler {
 public:
  // Validates p; seed -1 picks random_seed() (see seed()).
  explicit TokenSampler(const SamplingParams& p);

  const SamplingParams& params() const { return p_; }
  uint64_t seed() const { return seed_; }

  float draw() { return draws_.next(); }
  // The draw for one sampling step: the next draw, or 0 without consuming one when greedy (so a
  // greedy step never shifts the sequence).
  float step_draw() { return p_.greedy() ? 0.0f : draws_.next(); }
  // Samples from host logits with the next draw (no draw consumed when greedy).
  int sample(std::span<const float> logits);
  // Records a token that entered the context (prompt or generated) for the penalties.
  void accept(int token);
  void accept(std::span<const int> tokens);
  // The penalty history (oldest first); holds at least the last repeat_last_n tokens (trimmed
  // lazily; penalty_window() takes the window).
  std::span<const int> history() const { return history_; }
  void clear_history() { history_.clear(); }

 private:
  SamplingParams p_;
  uint64_t seed_;
  UniformDraws draws_;
  std::vector<int> history_;
  cpu::SampleScratch scratch_;
};

}  // namespace smolrt
