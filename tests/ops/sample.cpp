// GPU sampler vs its CPU twin (cpu::sample): the same token for the same logits, penalty
// history and uniform draw, over a SmolLM-sized vocabulary and every stage of the pipeline.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/sample.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/sample.h"
#include "model/model.h"
#include "runtime/chat.h"
#include "runtime/sampler.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU_HERE() \
  if (!have_gpu()) GTEST_SKIP() << "skipped: no CUDA GPU"

std::vector<float> random_logits(int n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct GpuSampler {
  int n;
  float* logits = nullptr;
  int *hist = nullptr, *out = nullptr;
  uint32_t* scratch = nullptr;  // the keys, past the shared-memory vocabulary
  explicit GpuSampler(int n_) : n(n_) {
    CUDA_CHECK(cudaMalloc(&logits, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&hist, 8192 * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&out, sizeof(int)));
    if (const size_t words = cuda::sample_scratch_words(n, 1))
      CUDA_CHECK(cudaMalloc(&scratch, words * sizeof(uint32_t)));
  }
  ~GpuSampler() {
    cudaFree(logits);
    cudaFree(hist);
    cudaFree(out);
    cudaFree(scratch);
  }
  void set_logits(const std::vector<float>& l) {
    CUDA_CHECK(cudaMemcpy(logits, l.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  int sample(const SamplingParams& p, float u, std::span<const int> history) {
    const std::span<const int> w = cpu::penalty_window(history, p);
    if (!w.empty()) {
      CUDA_CHECK(cudaMemcpy(hist, w.data(), w.size() * sizeof(int), cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemset(out, 0x7f, sizeof(int)));  // poison: a huge id
    cuda::sample(logits, n, p, u, hist, static_cast<int>(w.size()), out, scratch, nullptr);
    int r = 0;
    CUDA_CHECK(cudaMemcpy(&r, out, sizeof(int), cudaMemcpyDeviceToHost));
    return r;
  }
};

// For each parameter set: 64 draws from the seeded host PRNG; GPU and CPU must agree on all.
void expect_same_tokens(GpuSampler& g, const std::vector<float>& l, SamplingParams p,
                        const std::vector<int>& hist, const char* what) {
  g.set_logits(l);
  cpu::SampleScratch s;
  UniformDraws draws(99);
  int disagree = 0;
  for (int i = 0; i < 64; ++i) {
    const float u = draws.next();
    const int want = cpu::sample(l, p, u, hist, s);
    const int got = g.sample(p, u, hist);
    disagree += got != want;
    EXPECT_EQ(got, want) << what << " draw " << i << " u=" << u;
  }
  EXPECT_EQ(disagree, 0) << what;
}

constexpr int kVocab = 49152;

TEST(CudaSample, MatchesCpuSamplerAcrossThePipeline) {
  REQUIRE_GPU_HERE();
  GpuSampler g(kVocab);
  const std::vector<float> l = random_logits(kVocab, 5, 3.0f);
  std::vector<int> hist;
  for (int i = 0; i < 100; ++i) hist.push_back((i * 7919) % 300);  // repeats inside the window

  SamplingParams p;  // llama.cpp defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
  expect_same_tokens(g, l, p, {}, "defaults");
  p.temp = 1.5f;
  p.min_p = 0.0f;
  expect_same_tokens(g, l, p, {}, "top-k 40 + top-p, hot");
  p = SamplingParams{};
  p.top_k = 1024;
  p.top_p = 0.9f;
  p.min_p = 0.0f;
  expect_same_tokens(g, l, p, {}, "top-k 1024 (the limit)");
  p = SamplingParams{};
  p.top_k = 0;
  p.min_p = 0.2f;
  expect_same_tokens(g, l, p, {}, "top-k off, min-p cut");
  p.top_p = 1.0f;
  expect_same_tokens(g, l, p, {}, "min-p only");
  p = SamplingParams{};
  p.repeat_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.2f;
  p.repeat_last_n = 64;
  expect_same_tokens(g, l, p, hist, "penalties");
  p.temp = 0.0f;
  expect_same_tokens(g, l, p, hist, "greedy with penalties");
}

TEST(CudaSample, TiesNaNAndFlatLogits) {
  REQUIRE_GPU_HERE();
  GpuSampler g(kVocab);
  // Many equal logits: the top-k cut falls inside a tie, lowest ids first.
  std::vector<float> l(kVocab, 1.0f);
  for (int i = 0; i < kVocab; i += 97) l[i] = 2.0f;
  l[12345] = std::numeric_limits<float>::quiet_NaN();
  l[7] = std::numeric_limits<float>::quiet_NaN();
  SamplingParams p;
  p.top_k = 600;  // 507 twos + 93 of the ones
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  expect_same_tokens(g, l, p, {}, "tie at the k-th");
  p.top_k = 40;
  expect_same_tokens(g, l, p, {}, "ties above the k-th");
  // Small vocabulary (stories260K's 512) with NaN and -inf entries.
  GpuSampler small(512);
  std::vector<float> ls = random_logits(512, 8, 2.0f);
  ls[3] = std::numeric_limits<float>::quiet_NaN();
  ls[4] = -std::numeric_limits<float>::infinity();
  p = SamplingParams{};
  expect_same_tokens(small, ls, p, {}, "vocab 512");
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  expect_same_tokens(small, ls, p, {}, "vocab 512, plain temperature");
}

// Top-k off, the walk in id order: the block sums its ranges in another order than cpu::sample's
// sequential sum, so a draw may land on another id than the CPU's where the two sums straddle a
// boundary (several ids apart where the ids between weigh almost nothing). Every GPU pick is
// checked against the exact (double) distribution over the CPU's kept set instead: a kept id
// whose cumulative interval in id order holds u within 1e-5 (both float sums are within ~1e-6 of
// the exact one here; the ids a draw lands on weigh more); and most picks equal the CPU's.
void expect_picks_in_distribution(GpuSampler& g, const std::vector<float>& l,
                                  const SamplingParams& p, const std::string& what) {
  ASSERT_EQ(p.has_penalties(), false);
  g.set_logits(l);
  std::vector<int> ids;
  std::vector<float> probs;
  cpu::candidates(l.data(), (int)l.size(), p, ids, probs);
  ASSERT_TRUE(std::is_sorted(ids.begin(), ids.end())) << what << ": not the id-order walk";
  double lmax = -INFINITY;
  for (float v : l)
    if (!std::isnan(v)) lmax = std::max(lmax, (double)v);
  std::vector<double> cum(ids.size() + 1, 0.0);  // cum[j]: exact weight of the kept ids before j
  for (size_t j = 0; j < ids.size(); ++j)
    cum[j + 1] = cum[j] + std::exp((l[ids[j]] - lmax) / p.temp);
  cpu::SampleScratch s;
  UniformDraws draws(31);
  int equal = 0;
  for (int i = 0; i < 64; ++i) {
    const float u = i == 0 ? 0.0f : (i == 1 ? std::nextafter(1.0f, 0.0f) : draws.next());
    const int got = g.sample(p, u, {});
    const auto it = std::lower_bound(ids.begin(), ids.end(), got);
    ASSERT_TRUE(it != ids.end() && *it == got)
        << what << " u " << u << ": id " << got << " is not in the CPU's kept set";
    const size_t j = it - ids.begin();
    const double lo = cum[j] / cum.back(), hi = cum[j + 1] / cum.back();
    EXPECT_GT(hi, lo) << what << " u " << u << ": id " << got << " has no weight";
    EXPECT_LE(lo, u + 1e-5) << what << " u " << u << ": id " << got;
    EXPECT_GT(hi, u - 1e-5) << what << " u " << u << ": id " << got;
    equal += got == cpu::sample(l, p, u, {}, s);
  }
  EXPECT_GE(equal, 56) << what;
}

// An infinite top logit (+inf anywhere, or -inf everywhere): the lowest id at it, as the CPU's and
// greedy's pick, for every filter and draw, on both kernels (shared keys and scratch keys).
TEST(CudaSample, AnInfiniteTopLogitIsThePick) {
  REQUIRE_GPU_HERE();
  const float inf = std::numeric_limits<float>::infinity();
  for (const int n : {kVocab, 262144}) {
    GpuSampler g(n);
    std::vector<float> plus = random_logits(n, 17, 2.0f);
    plus[n / 3] = inf, plus[n / 2] = inf, plus[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> minus(n, -inf);
    minus[0] = std::numeric_limits<float>::quiet_NaN();
    for (const int top_k : {0, 40})
      for (const float top_p : {1.0f, 0.9f}) {
        SamplingParams p;
        p.top_k = top_k, p.top_p = top_p, p.min_p = 0.0f;
        g.set_logits(plus);
        EXPECT_EQ(g.sample(p, 0.5f, {}), n / 3) << n << " " << top_k << " " << top_p;
        g.set_logits(minus);
        EXPECT_EQ(g.sample(p, 0.5f, {}), 1) << n << " " << top_k << " " << top_p;
      }
  }
}

// Nothing cut (an OpenAI request with only a temperature: top-k off, top-p 1, min-p 0): the walk in
// id order over the whole vocabulary, on the GPU.
TEST(CudaSample, NothingCutWalksTheWholeVocabularyInIdOrder) {
  REQUIRE_GPU_HERE();
  GpuSampler g(kVocab);
  std::vector<float> l = random_logits(kVocab, 9, 3.0f);
  l[17] = std::numeric_limits<float>::quiet_NaN();
  l[kVocab - 1] = -std::numeric_limits<float>::infinity();
  for (const float temp : {0.7f, 1.0f, 1.5f}) {
    SamplingParams p;
    p.temp = temp, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
    expect_picks_in_distribution(g, l, p, "temp " + std::to_string(temp));
  }
  // All -inf: argmax (ties -> lowest id), as greedy.
  std::vector<float> flat(kVocab, -std::numeric_limits<float>::infinity());
  g.set_logits(flat);
  SamplingParams p;
  p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
  EXPECT_EQ(g.sample(p, 0.7f, {}), 0);
}

// Top-k off with top-p and min-p ({"temperature": T, "top_p": P} in OpenAI's API): the kept set is
// every token above a logit and the first ids of the ties at it, found on the GPU by radix
// selects over integer weights, however many tokens it holds: on flat logits (top-p sets of
// thousands), peaked ones (a few ids), logits on a grid of 1/8 (thousands of ties, one of which
// the top-p cut falls inside), one logit for all (the cut inside a tie of the whole vocabulary),
// logits within 0.01 of each other and logits thousands apart (most weigh nothing).
TEST(CudaSample, TopKOffCutsAtALogitForAnyTopPSet) {
  REQUIRE_GPU_HERE();
  GpuSampler g(kVocab);
  std::vector<float> grid = random_logits(kVocab, 14, 1.5f);
  for (float& v : grid) v = std::round(v * 8.0f) / 8.0f;
  grid[5] = std::numeric_limits<float>::quiet_NaN();
  grid[6] = -std::numeric_limits<float>::infinity();
  const struct {
    const char* name;
    std::vector<float> l;
  } cases[] = {{"flat", random_logits(kVocab, 13, 1.0f)},
               {"peaked", random_logits(kVocab, 12, 8.0f)},
               {"grid", grid},
               {"constant", std::vector<float>(kVocab, 0.5f)},
               {"narrow", random_logits(kVocab, 15, 0.01f)},
               {"wide", random_logits(kVocab, 16, 1000.0f)}};
  for (const auto& c : cases)
    for (const float top_p : {0.5f, 0.9f, 0.95f, 1.0f})
      for (const float min_p : {0.0f, 0.05f}) {
        SamplingParams p;
        p.temp = 0.9f, p.top_k = 0, p.top_p = top_p, p.min_p = min_p;
        expect_picks_in_distribution(g, c.l, p,
                                     std::string(c.name) + " top_p " + std::to_string(top_p) +
                                         " min_p " + std::to_string(min_p));
      }
  // The grid's cut falls inside a tie: the kept ties are the lowest ids, a prefix of them.
  std::vector<int> ids;
  std::vector<float> probs;
  SamplingParams p;
  p.temp = 0.9f, p.top_k = 0, p.top_p = 0.9f, p.min_p = 0.0f;
  cpu::candidates(grid.data(), kVocab, p, ids, probs);
  float v = INFINITY;
  for (int id : ids) v = std::min(v, grid[id]);
  int at_v = 0, kept_at_v = 0, last_kept = -1, first_dropped = kVocab;
  for (int t = 0; t < kVocab; ++t) {
    if (grid[t] != v) continue;
    ++at_v;
    if (std::binary_search(ids.begin(), ids.end(), t)) {
      ++kept_at_v;
      last_kept = t;
    } else {
      first_dropped = std::min(first_dropped, t);
    }
  }
  EXPECT_GT(kept_at_v, 0);
  EXPECT_LT(kept_at_v, at_v) << "the cut is not inside the tie at " << v;
  EXPECT_LT(last_kept, first_dropped);
}

TEST(CudaSample, TopKAboveTheLimitAsksForTheHostPath) {
  REQUIRE_GPU_HERE();
  GpuSampler g(kVocab);
  const std::vector<float> l = random_logits(kVocab, 6, 1.0f);
  g.set_logits(l);
  SamplingParams p;
  p.top_p = 1.0f;
  p.top_k = 5000;  // a top-k above the GPU limit
  EXPECT_EQ(g.sample(p, 0.5f, {}), -1);
  p.top_k = 0;  // no top-k: any top-p set
  p.top_p = 0.9f;
  p.min_p = 0.0f;
  EXPECT_NE(g.sample(p, 0.5f, {}), -1);
  // A vocabulary past the sampler's limit, or past shared memory without a scratch, is an Error,
  // not a silent wrong answer.
  EXPECT_GE(cuda::sample_shared_vocab(), kVocab);
  EXPECT_EQ(cuda::sample_scratch_words(kVocab, 4), 0u);
  EXPECT_THROW(cuda::sample(g.logits, cuda::kSampleMaxVocab + 1, p, 0.5f, nullptr, 0, g.out,
                            g.scratch, nullptr),
               Error);
  EXPECT_THROW(cuda::sample(g.logits, cuda::sample_shared_vocab() + 1, p, 0.5f, nullptr, 0, g.out,
                            nullptr, nullptr),
               Error);
}

// Gemma 3's vocabulary (262,144 tokens) passes shared memory: the keys live in a global scratch
// row per block, and top-p's radix select sums its weights in three 11-bit pieces. The same
// checks as on SmolLM's vocabulary: the sorted (top-k) path equal to the CPU's picks, the id-order
// walk against the exact distribution over the CPU's kept set, penalties; and a two-row launch
// whose blocks keep to their own scratch rows.
TEST(CudaSample, ALargeVocabularyKeepsItsKeysInAScratch) {
  REQUIRE_GPU_HERE();
  constexpr int kBig = 262144;
  ASSERT_GT(kBig, cuda::sample_shared_vocab());
  ASSERT_EQ(cuda::sample_scratch_words(kBig, 3), size_t(3) * kBig);
  GpuSampler g(kBig);
  const std::vector<float> l = random_logits(kBig, 15, 2.0f);
  std::vector<int> hist;
  for (int i = 0; i < 64; ++i) hist.push_back((i * 40503) % kBig);
  SamplingParams p;  // llama.cpp's defaults: top-k 40
  expect_same_tokens(g, l, p, {}, "defaults, 262k");
  p.repeat_penalty = 1.3f, p.presence_penalty = 0.4f;
  expect_same_tokens(g, l, p, hist, "penalties, 262k");
  for (const float top_p : {0.9f, 1.0f}) {
    p = SamplingParams{};
    p.top_k = 0, p.top_p = top_p, p.min_p = 0.0f;
    expect_picks_in_distribution(g, l, p, "top-k off, top_p " + std::to_string(top_p) + ", 262k");
  }
  // One logit for all: top-p's cut inside a tie of the whole vocabulary.
  p = SamplingParams{};
  p.top_k = 0, p.top_p = 0.5f, p.min_p = 0.0f;
  expect_picks_in_distribution(g, std::vector<float>(kBig, 0.5f), p, "constant, top_p 0.5, 262k");

  constexpr int kRows = 2;
  std::vector<float> block((size_t)kRows * kBig);
  std::copy(l.begin(), l.end(), block.begin());
  const std::vector<float> l2 = random_logits(kBig, 16, 4.0f);
  std::copy(l2.begin(), l2.end(), block.begin() + kBig);
  std::vector<cuda::SampleRow> sr(kRows);
  sr[0].p.top_k = 0, sr[0].p.top_p = 0.8f, sr[0].p.min_p = 0.0f, sr[0].u = 0.37f;
  sr[1].u = 0.61f, sr[1].logits_row = 1, sr[1].out = 1;
  float* d_block = nullptr;
  int* d_out = nullptr;
  uint32_t* d_scratch = nullptr;
  cuda::SampleRow* d_rows = nullptr;
  CUDA_CHECK(cudaMalloc(&d_block, block.size() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_out, kRows * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&d_scratch, cuda::sample_scratch_words(kBig, kRows) * sizeof(uint32_t)));
  CUDA_CHECK(cudaMalloc(&d_rows, kRows * sizeof(cuda::SampleRow)));
  CUDA_CHECK(
      cudaMemcpy(d_block, block.data(), block.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(
      cudaMemcpy(d_rows, sr.data(), kRows * sizeof(cuda::SampleRow), cudaMemcpyHostToDevice));
  cuda::sample_rows(d_block, kBig, kBig, d_rows, kRows, nullptr, d_out, d_scratch, nullptr);
  int got[kRows] = {};
  CUDA_CHECK(cudaMemcpy(got, d_out, sizeof(got), cudaMemcpyDeviceToHost));
  cudaFree(d_block);
  cudaFree(d_out);
  cudaFree(d_scratch);
  cudaFree(d_rows);
  cpu::SampleScratch s;
  EXPECT_EQ(got[0], cpu::sample(l, sr[0].p, sr[0].u, {}, s));
  EXPECT_EQ(got[1], cpu::sample(l2, sr[1].p, sr[1].u, {}, s));
}

// sample_rows: six rows of a logits block in one launch, each with its own parameters, draw,
// penalty window and output slot (written in reverse order of the rows), against cpu::sample on
// its row; a row whose top-k is past the GPU's limit writes -1 in its slot only, and the slots no
// row names keep their poison.
TEST(CudaSample, RowsInOneLaunchMatchCpuSamplerPerRow) {
  REQUIRE_GPU_HERE();
  constexpr int kRows = 7, kLd = kVocab + 4;  // a pitch past the row: rows are found by ld
  std::vector<float> block((size_t)kRows * kLd, std::numeric_limits<float>::quiet_NaN());
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < kRows; ++r) {
    rows.push_back(random_logits(kVocab, 20 + r, 1.5f + r));
    std::copy(rows[r].begin(), rows[r].end(), block.begin() + (size_t)r * kLd);
  }
  std::vector<SamplingParams> ps(kRows);
  ps[1].temp = 1.5f, ps[1].min_p = 0.0f;
  ps[2].top_k = 0, ps[2].min_p = 0.2f;
  ps[3].repeat_penalty = 1.3f, ps[3].presence_penalty = 0.4f, ps[3].frequency_penalty = 0.2f;
  ps[4] = ps[3], ps[4].temp = 0.0f;                         // greedy with penalties
  ps[5].top_k = 0, ps[5].top_p = 0.9f, ps[5].min_p = 0.0f;  // top-p alone
  ps[6].top_k = 5000;                                       // past the GPU's top-k: -1
  std::vector<std::vector<int>> hist(kRows);
  for (int i = 0; i < 100; ++i) hist[3].push_back((i * 7919) % 300);
  for (int i = 0; i < 40; ++i) hist[4].push_back((i * 31) % 50);
  std::vector<int> flat;
  std::vector<cuda::SampleRow> sr(kRows);
  UniformDraws draws(5);
  for (int r = 0; r < kRows; ++r) {
    const std::span<const int> w = cpu::penalty_window(hist[r], ps[r]);
    sr[r].p = ps[r], sr[r].u = draws.next(), sr[r].logits_row = r;
    sr[r].hist_off = (int)flat.size(), sr[r].n_hist = (int)w.size();
    sr[r].out = 2 * (kRows - 1 - r);  // every other slot, reversed
    flat.insert(flat.end(), w.begin(), w.end());
  }
  float* d_logits = nullptr;
  int *d_hist = nullptr, *d_out = nullptr;
  cuda::SampleRow* d_rows = nullptr;
  CUDA_CHECK(cudaMalloc(&d_logits, block.size() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_hist, flat.size() * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&d_out, 2 * kRows * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&d_rows, kRows * sizeof(cuda::SampleRow)));
  CUDA_CHECK(
      cudaMemcpy(d_logits, block.data(), block.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_hist, flat.data(), flat.size() * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_CHECK(
      cudaMemcpy(d_rows, sr.data(), kRows * sizeof(cuda::SampleRow), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(d_out, 0x7f, 2 * kRows * sizeof(int)));  // poison: a huge id
  cuda::sample_rows(d_logits, kLd, kVocab, d_rows, kRows, d_hist, d_out, nullptr, nullptr);
  std::vector<int> got(2 * kRows);
  CUDA_CHECK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(int), cudaMemcpyDeviceToHost));
  cudaFree(d_logits);
  cudaFree(d_hist);
  cudaFree(d_out);
  cudaFree(d_rows);
  cpu::SampleScratch scratch;
  for (int r = 0; r < kRows; ++r) {
    const int want = r == 6 ? -1 : cpu::sample(rows[r], ps[r], sr[r].u, hist[r], scratch);
    EXPECT_EQ(got[sr[r].out], want) << "row " << r;
    EXPECT_EQ(got[sr[r].out + 1], 0x7f7f7f7f) << "slot after row " << r << " written";
  }
  EXPECT_NO_THROW(cuda::sample_rows(nullptr, kVocab, kVocab, nullptr, 0, nullptr, nullptr, nullptr,
                                    nullptr));  // no rows: no launch
  EXPECT_THROW(
      cuda::sample_rows(d_logits, kVocab - 1, kVocab, d_rows, 1, nullptr, d_out, nullptr, nullptr),
      Error);  // a pitch below the row
}

// The CUDA backend's sampling step (GPU kernel, 4-byte readback) picks what cpu::sample picks on
// the same step's logits, for the same draw and history, along a sampled trajectory.
TEST(CudaSampleBackend, SampleStepEqualsCpuSampleOnTheSameLogits) {
  REQUIRE_GPU_HERE();
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Model m = load_model(path.string());
  BackendOptions bo;
  bo.kind = "cuda";
  bo.n_ctx = 96;
  auto be = make_backend(m, bo);
  std::vector<int> hist = {1, 403, 407, 261, 378};
  be->forward_prompt(hist);
  for (const bool penalties : {false, true}) {
    SamplingParams p;
    p.temp = 1.2f;
    if (penalties) {
      p.repeat_penalty = 1.4f;
      p.frequency_penalty = 0.3f;
      p.top_k = 0;  // top-k off: the min-p cut, the walk in id order
    }
    UniformDraws draws(penalties ? 11 : 7);
    cpu::SampleScratch scratch;
    int t = 432;
    for (int i = 0; i < 24; ++i) {
      const int pos = be->position();
      std::span<const float> l = be->forward_token(t, pos);
      const std::vector<float> logits(l.begin(), l.end());
      be->rollback(pos);
      const float u = draws.next();
      const int got = be->forward_token_sample(t, pos, p, u, hist);
      EXPECT_EQ(be->position(), pos + 1);
      EXPECT_EQ(got, cpu::sample(logits, p, u, hist, scratch)) << "step " << i;
      hist.push_back(t);
      t = got;
    }
  }
  // The prompt variant samples from the last prompt token's logits.
  be->reset();
  SamplingParams p;
  const std::vector<int> prompt = {1, 403, 407};
  std::span<const float> l = be->forward_prompt(prompt);
  const std::vector<float> logits(l.begin(), l.end());
  be->reset();
  cpu::SampleScratch scratch;
  EXPECT_EQ(be->forward_prompt_sample(prompt, p, 0.3f, prompt),
            cpu::sample(logits, p, 0.3f, prompt, scratch));
}

// A chat on the CUDA backend (GPU sampling, KV kept between turns) with a fixed seed gives the
// same replies twice.
TEST(CudaSampleBackend, ChatWithASeedIsReproducible) {
  REQUIRE_GPU_HERE();
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Model m = load_model(path.string());
  const Tokenizer tok(vocab_from_gguf(*m.file));
  auto chat = [&] {
    BackendOptions bo;
    bo.kind = "cuda";
    bo.n_ctx = 256;
    auto be = make_backend(m, bo);
    ChatOptions o;
    o.sampling.seed = 99;
    o.max_tokens = 16;
    ChatSession s(*be, tok, o);
    std::vector<int> all = s.turn("Once upon a time").tokens;
    const std::vector<int> r2 = s.turn("The cat").tokens;
    all.insert(all.end(), r2.begin(), r2.end());
    return all;
  };
  const std::vector<int> a = chat();
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, chat());
}

}  // namespace
}  // namespace smolrt
