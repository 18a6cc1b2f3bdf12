// GPU sampling: the pipeline of backend/sampling.h in one single-block kernel (one block per row
// when a step samples several: sample_rows), so a decode step reads back 4 bytes instead of the
// vocab_size logits. CPU twin: cpu::sample (same token for the
// same logits, history and draw, up to float rounding at a cumulative-probability boundary).
//
// The logits live in shared memory as keys during the kernel: vocabularies up to
// sample_max_vocab() tokens (about 55k on Hopper; SmolLM's 49152 fits).
// Scope: top-k above kSampleMaxCandidates (and below the valid tokens) writes -1 and the caller
// samples on the host (cpu::sample on the logits); top-k off takes any top-p and min-p.
#pragma once

#include <cuda_runtime.h>

#include "core/sampling.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

constexpr int kSampleMaxCandidates = 1024;

// Largest vocabulary the kernel takes (from the device's opt-in shared memory per block).
int sample_max_vocab();

// logits: [n] f32 (not modified), n <= sample_max_vocab() (else Error); history: [n_hist] token
// ids, already cut to the penalty window (may be null when n_hist == 0; ids must be in [0, n): the
// host checks them); u: the uniform draw in [0, 1); out: 1 int, the sampled id, or -1 when
// top-k exceeds kSampleMaxCandidates.
void sample(const float* logits, int n, const SamplingParams& p, float u, const int* history,
            int n_hist, int* out, const Launch& s);

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
// rows' windows and indices; n <= sample_max_vocab().
void sample_rows(const float* logits, int ld, int n, const SampleRow* rows, int count,
                 const int* history, int* out, const Launch& s);

}  // namespace smolrt::cuda
