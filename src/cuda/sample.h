// GPU sampling: the pipeline of backend/sampling.h in one single-block kernel (one block per row
// when a step samples several: sample_rows), so a decode step reads back 4 bytes instead of the
// vocab_size logits. CPU twin: cpu::sample (same token for the
// same logits, history and draw, up to float rounding at a cumulative-probability boundary).
//
// The logits live in shared memory as keys during the kernel for vocabularies up to
// sample_shared_vocab() tokens (about 50k on Hopper; SmolLM's 49,152 fits), in a global scratch
// row per sampled row for larger ones (Gemma 3's 262,144) up to kSampleMaxVocab.
// Scope: top-k above kSampleMaxCandidates (and below the valid tokens) writes -1 and the caller
// samples on the host (cpu::sample on the logits); top-k off takes any top-p and min-p.
#pragma once

#include <cuda_runtime.h>

#include "core/sampling.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

constexpr int kSampleMaxCandidates = 1024;
constexpr int kSampleMaxVocab = 1 << 21;

// Largest vocabulary whose keys fit the device's opt-in shared memory per block.
int sample_shared_vocab();

// The device scratch (uint32 words) a launch of `rows` rows of n tokens needs: 0 up to
// sample_shared_vocab(), n per row above.
size_t sample_scratch_words(int n, int rows);

// logits: [n] f32 (not modified), n <= kSampleMaxVocab (else Error); history: [n_hist] token
// ids, already cut to the penalty window (may be null when n_hist == 0; ids must be in [0, n): the
// host checks them); u: the uniform draw in [0, 1); out: 1 int, the sampled id, or -1 when
// top-k exceeds kSampleMaxCandidates; scratch: sample_scratch_words(n, 1) words (Error when
// null and needed).
void sample(const float* logits, int n, const SamplingParams& p, float u, const int* history,
            int n_hist, int* out, uint32_t* scratch, const Launch& s);

// One row of a batched sample_rows launch: the row of the logits block, its parameters and draw,
// its penalty window (history[hist_off, hist_off + n_hist)) and the index of its id in out.
struct SampleRow {
  SamplingParams p;
  float u = 0.f;
  int logits_row = 0;
  int hist_off = 0, n_hist = 0;
  int out = 0;
};

// sample() for count rows in one launch, one block per row (a step's sampled rows run side by
// side instead of one single-block launch each): rows is a device array [count]; logits [..][ld];
// each row's rules as sample()'s (its id, or -1, to out[rows[i].out]). The caller has checked the
// rows' windows and indices; scratch: sample_scratch_words(n, count) words.
void sample_rows(const float* logits, int ld, int n, const SampleRow* rows, int count,
                 const int* history, int* out, uint32_t* scratch, const Launch& s);

}  // namespace smolrt::cuda
