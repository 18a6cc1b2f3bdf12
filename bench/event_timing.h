// CUDA-event timing for the bench programs: the median, min and max over repetitions of work
// enqueued on one stream (after warm-up runs), as the elapsed time between two events around it.
#pragma once

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "runtime/bench.h"

namespace smolrt::bench {

// `prepare` runs before each repetition outside the timed span (e.g. resetting buffers); `body`
// enqueues the timed work on `st`. Milliseconds.
template <class F, class P>
Stat time_ms(F&& body, int reps, cudaStream_t st, int warmup, P&& prepare) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) {
    prepare();
    body();
  }
  CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    prepare();
    CUDA_CHECK(cudaEventRecord(e0, st));
    body();
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return stat_of(std::move(ms));
}

template <class F>
Stat time_ms(F&& body, int reps, cudaStream_t st, int warmup = 3) {
  return time_ms(body, reps, st, warmup, [] {});
}

}  // namespace smolrt::bench
