// CPU sampling: the reference ("CPU twin") of the GPU sampling kernel. Implements exactly the
// pipeline documented in backend/sampling.h. No PRNG here: the caller passes the uniform draw.
#pragma once

#include <span>
#include <vector>

#include "core/sampling.h"

namespace smolrt::cpu {

// Reusable buffers so a decode loop does not allocate per token.
struct SampleScratch {
  std::vector<float> logits;  // [n_vocab] penalized copy of the input logits
  std::vector<int> ids;       // kept candidate ids, in the walk order (core/sampling.h step 8)
  std::vector<float> probs;   // probabilities of `ids` after temperature, summing to 1
  std::vector<int> window;    // sorted copy of the penalty window
};

// The penalty window: the last repeat_last_n entries of `history` (all of it when -1, none when
// 0). Ids outside [0, n_vocab) are an Error naming the id.
std::span<const int> penalty_window(std::span<const int> history, const SamplingParams& p);

// Step 1: applies repetition / presence / frequency penalties in place to logits[0..n) for the
// tokens in penalty_window(history, p). `window` is scratch.
void apply_penalties(float* logits, int n, std::span<const int> history, const SamplingParams& p,
                     std::vector<int>& window);

// Steps 3-7 on already-penalized logits (temp must be > 0): fills ids (kept candidates in the
// walk order of step 8) and probs (their post-temperature probabilities, sum 1). At least one
// candidate is kept unless every logit is NaN (then ids is empty).
void candidates(const float* logits, int n, const SamplingParams& p, std::vector<int>& ids,
                std::vector<float>& probs);

// The whole pipeline: returns the sampled id in [0, n). `history` is the generated/prompt token
// history (oldest first); u is a uniform draw in [0, 1). Greedy when p.temp <= 0 (u unused).
int sample(std::span<const float> logits, const SamplingParams& p, float u,
           std::span<const int> history, SampleScratch& scratch);

}  // namespace smolrt::cpu
