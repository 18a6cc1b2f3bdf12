// Sampling parameters and the one sampling algorithm every backend implements (the CPU version
// is cpu::sample in backend/cpu/sample.h; a GPU kernel must pick the same token for the same
// logits, recent tokens and uniform draw). Plain data: the backend layer knows nothing of the
// PRNG or history bookkeeping, which live in runtime/sampler.h.
//
// The pipeline, in this order (llama.cpp's default chain order):
//   1. penalties over `recent` (the last repeat_last_n tokens, oldest first): for each distinct
//      token t seen c times: l[t] = l[t] > 0 ? l[t] / repeat_penalty : l[t] * repeat_penalty;
//      then l[t] -= c * frequency_penalty + presence_penalty.
//   2. temp <= 0: greedy, argmax of the penalized logits (ties -> lowest id; NaN never wins).
//   3. candidates ordered by (logit descending, id ascending); NaN logits are dropped. When the
//      largest logit is infinite (+inf anywhere, or -inf everywhere) the lowest id at it is the
//      pick, as greedy's.
//   4. top-k (k > 0): keep the first k.
//   5. top-p (< 1): weights w_i = exp(l_i - l_max) over the kept candidates (no temperature),
//      in integer units of 2^-32 (truncated) so every summation order gives the same sums; keep
//      the shortest prefix whose weight sum is >= ceil(top_p * sum(w)) (at least one).
//   6. min-p (> 0): keep candidates with p >= min_p * p_max, i.e. l >= l_max + log(min_p).
//   7. temperature: p_i = softmax(l_i / temp) over the kept candidates.
//   8. pick: the first candidate i (in the walk order) with cumsum(p_0..p_i) > u * sum(p); the
//      last kept candidate if rounding leaves none. u is one uniform draw in [0, 1). The walk
//      order is that of 3 when top-k cuts (k below the valid tokens); otherwise 4-6 keep every
//      token above a logit (and the first ids of the ties at it), and the walk goes in id order
//      over the kept tokens of nonzero weight exp((l_i - l_max) / temp): the same distribution
//      without ordering the vocabulary (which a GPU block cannot afford per token).
#pragma once

#include <cstdint>

namespace smolrt {

struct SamplingParams {
  float temp = 0.8f;               // 0 = greedy (argmax after penalties); must be >= 0
  int top_k = 40;                  // 0 = off (all tokens); must be >= 0
  float top_p = 0.95f;             // 1 = off; must be in (0, 1]
  float min_p = 0.05f;             // 0 = off; must be in [0, 1]
  float repeat_penalty = 1.0f;     // 1 = off; must be > 0
  int repeat_last_n = 64;          // tokens of history the penalties look at; 0 = off, -1 = all
  float presence_penalty = 0.0f;   // 0 = off
  float frequency_penalty = 0.0f;  // 0 = off
  int64_t seed = -1;               // host PRNG seed; -1 = a random seed (reported by the CLI)

  // constexpr: callable from device code (--expt-relaxed-constexpr) by the GPU sampler.
  constexpr bool greedy() const { return temp <= 0.0f; }
  constexpr bool has_penalties() const {
    return repeat_last_n != 0 &&
           (repeat_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f);
  }
};

// Throws Error naming the flag (--temp, --top-p, ...) and its valid range when a value is out of
// range or not finite. Here rather than in runtime/ so backends (BatchBackend::step) can check
// the parameters each request brings.
void validate(const SamplingParams& p);

}  // namespace smolrt
