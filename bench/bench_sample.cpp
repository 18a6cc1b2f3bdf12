// Sampling cost per token over a vocabulary of logits ~ N(0, 3) (SmolLM's 49,152 unless --vocab;
// Gemma 3's 262,144 takes the GPU kernel's scratch-keys path): the CPU
// sampler (cpu::sample) and, in CUDA builds with a GPU, the GPU kernel (cuda::sample, timed with
// CUDA events, 4-byte result). Validates first: GPU and CPU pick the same tokens for the same
// draws. Reports median [min, max] microseconds over runs after a warm-up.
//
//   build/bench_sample [--runs N] [--vocab N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/sample.h"
#include "runtime/sampler.h"
#if defined(SMOLRT_HAVE_CUDA)
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "cuda/sample.h"
#endif

namespace {

struct Case {
  const char* name;
  smolrt::SamplingParams p;
  int n_hist;
};

void report(const char* what, const char* name, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  std::printf("%-4s %-34s median %8.1f us  [%.1f, %.1f]\n", what, name, us[us.size() / 2],
              us.front(), us.back());
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 50;
  int n = 49152;  // SmolLM's vocabulary; Gemma 3's is 262,144
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) n = std::atoi(argv[++i]);
  }
  if (runs < 1) runs = 1;
  if (n < 64) n = 64;
  std::vector<float> logits(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float& x : logits) x = nd(rng);
  std::vector<int> hist(64);
  for (int i = 0; i < 64; ++i) hist[i] = (i * 769) % n;

  std::vector<Case> cases;
  cases.push_back({"defaults (k40 p.95 minp.05 t.8)", {}, 0});
  Case pen{"defaults + penalties (64)", {}, 64};
  pen.p.repeat_penalty = 1.1f;
  cases.push_back(pen);
  Case minp{"top-k off, min-p 0.1", {}, 0};
  minp.p.top_k = 0;
  minp.p.min_p = 0.1f;
  cases.push_back(minp);
  Case temp_only{"temperature alone (OpenAI defaults)", {}, 0};
  temp_only.p.top_k = 0, temp_only.p.top_p = 1.0f, temp_only.p.min_p = 0.0f;
  cases.push_back(temp_only);
  Case top_p{"top-k off, top-p 0.9", {}, 0};
  top_p.p.top_k = 0, top_p.p.top_p = 0.9f, top_p.p.min_p = 0.0f;
  cases.push_back(top_p);
  Case greedy{"greedy", {}, 0};
  greedy.p.temp = 0.0f;
  cases.push_back(greedy);

  smolrt::cpu::SampleScratch scratch;
  for (const Case& c : cases) {
    const std::span<const int> h(hist.data(), static_cast<size_t>(c.n_hist));
    std::vector<double> us;
    smolrt::UniformDraws draws(5);
    for (int r = 0; r <= runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      volatile int t = smolrt::cpu::sample(logits, c.p, draws.next(), h, scratch);
      (void)t;
      const double dt =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) us.push_back(dt);
    }
    report("cpu", c.name, us);
  }

#if defined(SMOLRT_HAVE_CUDA)
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("gpu  (no CUDA GPU: skipped)\n");
    return 0;
  }
  float* d_logits = nullptr;
  int *d_hist = nullptr, *d_out = nullptr;
  CUDA_CHECK(cudaMalloc(&d_logits, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_hist, hist.size() * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&d_out, sizeof(int)));
  uint32_t* d_scratch = nullptr;
  const size_t scratch_words = smolrt::cuda::sample_scratch_words(n, 1);
  if (scratch_words > 0) CUDA_CHECK(cudaMalloc(&d_scratch, scratch_words * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemcpy(d_logits, logits.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_hist, hist.data(), hist.size() * sizeof(int), cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  int mismatches = 0;
  for (const Case& c : cases) {
    const std::span<const int> h(hist.data(), static_cast<size_t>(c.n_hist));
    smolrt::UniformDraws draws(5);
    std::vector<double> us;
    for (int r = 0; r <= runs; ++r) {
      const float u = draws.next();
      CUDA_CHECK(cudaEventRecord(e0));
      smolrt::cuda::sample(d_logits, n, c.p, u, d_hist, c.n_hist, d_out, d_scratch, nullptr);
      CUDA_CHECK(cudaEventRecord(e1));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      int got = 0;
      CUDA_CHECK(cudaMemcpy(&got, d_out, sizeof(int), cudaMemcpyDeviceToHost));
      mismatches += got != smolrt::cpu::sample(logits, c.p, u, h, scratch);
      if (r > 0) us.push_back(ms * 1000.0);
    }
    report("gpu", c.name, us);
  }
  if (mismatches) {
    std::printf("VALIDATION FAILED: %d GPU picks differ from the CPU sampler\n", mismatches);
    return 1;
  }
#else
  std::printf("gpu  (CPU-only build: skipped)\n");
#endif
  return 0;
}
