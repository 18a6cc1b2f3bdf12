#include "runtime/sampler.h"

#include "core/error.h"

namespace smolrt {

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

TokenSampler::TokenSampler(const SamplingParams& p)
    : p_((validate(p), p)),
      seed_(p.seed < 0 ? random_seed() : static_cast<uint64_t>(p.seed)),
      draws_(seed_) {}

int TokenSampler::sample(std::span<const float> logits) {
  const float u = step_draw();
  return cpu::sample(logits, p_, u, history_, scratch_);
}

void TokenSampler::accept(int token) {
  if (p_.repeat_last_n == 0) return;
  history_.push_back(token);
  // Trim lazily (amortized O(1)): keep at most 2x the window, cut back to the window.
  if (p_.repeat_last_n > 0 && history_.size() >= 2 * static_cast<size_t>(p_.repeat_last_n)) {
    history_.erase(history_.begin(),
                   history_.end() - static_cast<std::ptrdiff_t>(p_.repeat_last_n));
  }
}

void TokenSampler::accept(std::span<const int> tokens) {
  for (int t : tokens) accept(t);
}

}  // namespace smolrt
