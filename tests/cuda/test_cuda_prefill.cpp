// Prompts through the CUDA backend (one sequence of the CUDA engine: many-row steps on the GEMMs)
// against its token-by-token path (one-row steps, the decode kernels): logits of every position,
// argmax, step sizes, continuation of an existing cache, decode after a prompt, sampling, errors.
// Model: the synthetic SmolLM-135M-shaped Q4_0 model named by SMOLRT_SYNTH_MODEL (30 layers,
// Q8_0 tied lm_head) -- stories260K is outside the many-row kernels and runs one row per step.
// The KV cache is fp32 (--kv-type f32), as the one-row reference's was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/single_sequence.h"
#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "prefill_test_util.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::rel_l2;

constexpr int kCtx = 1100;  // longest prompt (1000) + decode steps, well under the model's 8192

// step: tokens per step (1: every prompt token as its own one-row step, the reference); dense: -1
// = no fp16 copies (every step on the quantized GEMM), 0 = the measured choice, n > 0 = steps of n
// rows or more on the dense GEMMs.
std::unique_ptr<Backend> make(const Model& m, int step = 512, int dense = 0,
                              const CudaOptions& co = CudaOptions{}) {
  BackendOptions o;
  o.kind = "cuda";
  o.n_ctx = kCtx;
  o.kv_half = false;
  o.f16_weights = dense >= 0;
  o.dense_rows = std::max(dense, 0);
  BatchOptions b = single_sequence_options(o);
  b.max_step_tokens = step;
  return make_cuda_backend_ex(m, b, co);
}

std::vector<int> prompt_of(int n, int vocab, unsigned seed) {
  std::vector<int> t(n);
  unsigned x = seed * 2654435761u + 12345u;
  for (int& v : t) {
    x = x * 1664525u + 1013904223u;
    v = (int)((x >> 8) % (unsigned)vocab);
  }
  return t;
}

// Token-by-token reference: every position's logits through the one-row steps' decode kernels
// (fp32 GEMVs, fp32 KV cache).
std::vector<float> sequential_all(Backend& b, const std::vector<int>& toks) {
  b.reset();
  std::vector<float> all;
  for (int t : toks) {
    std::span<const float> l = b.forward_token(t, b.position());
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

// Logits bound (relative L2 per row): the batched GEMMs run on tensor cores with fp16 operands
// (~6e-4 relative per GEMM, in the prefill notes kept in git history: `git log -- bench/results`;
// test_step_forward.cpp measures well under 1e-2 on 2 layers with an fp16 cache); here the
// cache is fp32 (the decode one) but 30 layers compound, so the prefill kernels' own stated
// bound, 2e-2, is kept.
constexpr double kBound = 2e-2;

struct RowStats {
  double worst = 0;
  int argmax_equal = 0;
};

// Every row within kBound, finite, and the same argmax as the reference -- except where the
// reference itself is a near-tie: the batched path may then pick a token whose reference logit
// is within 0.1 RMS of the row of the maximum (random weights over 49k tokens give top-2 gaps
// of ~0.2 RMS on average, the per-element errors are ~1e-3 RMS). Callers also bound how many
// rows may differ at all.
RowStats expect_rows_close(const std::vector<float>& got, const std::vector<float>& ref, int V,
                           const std::string& what) {
  RowStats st;
  EXPECT_EQ(got.size(), ref.size()) << what;
  if (got.size() != ref.size()) return st;
  const int rows = (int)(ref.size() / V);
  for (int p = 0; p < rows; ++p) {
    const float* g = got.data() + (size_t)p * V;
    const float* r = ref.data() + (size_t)p * V;
    const double e = rel_l2(g, r, V);
    st.worst = std::max(st.worst, e);
    EXPECT_LT(e, kBound) << what << " position " << p;
    bool finite = true;
    for (int i = 0; i < V; ++i) finite &= std::isfinite(g[i]);
    EXPECT_TRUE(finite) << what << " position " << p;
    const int ra = cpu::argmax(r, V), ga = cpu::argmax(g, V);
    if (ga == ra) {
      ++st.argmax_equal;
    } else {
      EXPECT_LE((double)r[ra] - r[ga], test::near_tie_bound(r, V))
          << what << " position " << p << ": argmax " << ga << " vs reference " << ra;
    }
  }
  // Near-ties are rare: at least 3/4 of the rows pick exactly the reference token.
  EXPECT_GE(st.argmax_equal, (rows * 3) / 4) << what << ": argmax differs at too many positions";
  return st;
}

// --- every prompt length: all logits and the last-token path ----------------------------------

class CudaPrefillLength : public ::testing::TestWithParam<int> {};

TEST_P(CudaPrefillLength, MatchesSequentialForwardToken) {
  REQUIRE_SYNTH(m);
  const int n = GetParam();
  const int V = m.config.vocab_size;
  const std::vector<int> toks = prompt_of(n, V, (unsigned)n);
  std::vector<float> ref;
  // The quantized GEMM for every chunk, then the dense fp16 GEMMs for every chunk.
  for (int dense : {-1, 1}) {
    auto gpu = make(m, 512, dense);
    if (ref.empty()) ref = sequential_all(*gpu, toks);

    gpu->reset();
    const std::vector<float> all = gpu->forward_prompt_all(toks);
    EXPECT_EQ(gpu->position(), n);
    const RowStats st = expect_rows_close(all, ref, V, cat("n=", n, " all"));

    gpu->reset();
    std::span<const float> last = gpu->forward_prompt(toks);
    EXPECT_EQ(gpu->position(), n);
    const std::vector<float> ref_last(ref.end() - V, ref.end());
    const double e_last = rel_l2(last.data(), ref_last.data(), V);
    EXPECT_LT(e_last, kBound) << "n=" << n << " last-token logits";
    expect_rows_close(std::vector<float>(last.begin(), last.end()), ref_last, V,
                      cat("n=", n, " last"));
    std::cout << "[ prefill n=" << n << (dense > 0 ? " dense" : " quantized")
              << " ] worst row rel L2 " << st.worst << ", last " << e_last << ", argmax equal at "
              << st.argmax_equal << "/" << n << " positions\n";
    RecordProperty(dense > 0 ? "worst_rel_l2_dense" : "worst_rel_l2", std::to_string(st.worst));
  }
}

INSTANTIATE_TEST_SUITE_P(Prompt, CudaPrefillLength, ::testing::Values(1, 7, 32, 100, 512, 1000));

// --- step boundaries: prompts cut into steps of every size -------------------------------------

TEST(CudaPrefill, ChunkBoundaries) {
  REQUIRE_SYNTH(m);
  const int V = m.config.vocab_size;
  const std::vector<int> toks = prompt_of(100, V, 7);
  const std::vector<float> ref = sequential_all(*make(m), toks);
  const std::vector<float> ref_last(ref.end() - V, ref.end());
  for (int chunk : {1, 3, 7, 32, 33, 64, 99, 100}) {
    auto gpu = make(m, chunk);
    const std::vector<float> all = gpu->forward_prompt_all(toks);
    expect_rows_close(all, ref, V, cat("chunk=", chunk));
    gpu->reset();
    std::span<const float> last = gpu->forward_prompt(toks);
    EXPECT_LT(rel_l2(last.data(), ref_last.data(), V), kBound) << "chunk=" << chunk;
    EXPECT_EQ(gpu->position(), 100);
  }
}

// --- the cache handoff: decode after prefill ----------------------------------------------------

TEST(CudaPrefill, DecodeAfterPrefillMatchesDecodeAfterSequential) {
  REQUIRE_SYNTH(m);
  const int V = m.config.vocab_size;
  auto batched = make(m, 16), seq = make(m, 1);
  const std::vector<int> toks = prompt_of(40, V, 3);
  // Teacher-forced decode steps after each prefill: the decode kernels read the KV entries the
  // many-row steps wrote (fp32, same pool), so the logits agree within the prefill bound.
  const std::vector<int> forced = prompt_of(12, V, 4);
  batched->forward_prompt(toks);
  seq->forward_prompt(toks);
  ASSERT_EQ(batched->position(), 40);
  ASSERT_EQ(seq->position(), 40);
  double worst = 0;
  for (int t : forced) {
    std::span<const float> a = batched->forward_token(t, batched->position());
    std::vector<float> av(a.begin(), a.end());
    std::span<const float> b = seq->forward_token(t, seq->position());
    const double e = rel_l2(av.data(), b.data(), V);
    worst = std::max(worst, e);
    EXPECT_LT(e, kBound) << "decode step at position " << batched->position() - 1;
  }
  std::cout << "[ decode after prefill ] worst rel L2 " << worst << "\n";

  // Greedy: the same tokens after a batched and after a sequential prefill (the batched backend
  // picks them with the GPU argmax, the sequential one on the host from its logits). Should the
  // sequences part, it must be at a near-tie of the sequential logits (as in
  // expect_rows_close); after that they are different texts and the comparison stops.
  batched->reset();
  seq->reset();
  std::span<const float> lb = batched->forward_prompt(toks);
  int tb = cpu::argmax(lb.data(), V);
  std::span<const float> ls = seq->forward_prompt(toks);
  int same = 0;
  for (int i = 0; i < 8; ++i) {
    const int ts = cpu::argmax(ls.data(), V);
    if (tb != ts) {
      EXPECT_LE((double)ls[ts] - ls[tb], test::near_tie_bound(ls.data(), V))
          << "greedy step " << i << ": batched-prefill decode picked " << tb << ", sequential "
          << ts;
      break;
    }
    ++same;
    tb = batched->forward_token_greedy(tb, batched->position());
    ls = seq->forward_token(ts, seq->position());
  }
  std::cout << "[ greedy after prefill ] " << same << "/8 tokens equal\n";
  if (same == 8) {
    EXPECT_EQ(batched->position(), 48);
  }
}

// A prompt shape seen before replays its step bucket's CUDA graph (the first run of a bucket is
// eager, then captured): the same bits as the eager run, decode continues from the cache the
// replay wrote, and a replay with other ids gives other logits.
TEST(CudaPrefill, RecurringPromptShapeReplaysAGraph) {
  REQUIRE_SYNTH(m);
  const int V = m.config.vocab_size;
  // bit-reproducible GEMMs (no split-K atomics), so runs can be compared exactly
  auto gpu = make(m, 512, 0, CudaOptions{.split_k = false});
  auto run = [&](int n, uint32_t seed, std::vector<int>* greedy = nullptr) {
    gpu->reset();
    std::span<const float> l = gpu->forward_prompt(prompt_of(n, V, seed));
    std::vector<float> out(l.begin(), l.end());
    if (greedy != nullptr) {
      int t = cpu::argmax(l.data(), V);
      for (int i = 0; i < 4; ++i) {
        greedy->push_back(t);
        t = gpu->forward_token_greedy(t, gpu->position());
      }
      EXPECT_EQ(gpu->position(), n + 4);
    }
    return out;
  };
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int>> greedy(4);
  for (int round = 0; round < 4; ++round) {  // eager + capture, replay, replay, replay
    // Rounds 2 and 3: other ids, same shape (the graph reads the ids staged for this call).
    logits.push_back(run(32, round < 2 ? 5u : 6u, &greedy[round]));
  }
  // Same kernels, same tiles, fixed summation orders: bit-identical.
  EXPECT_EQ(logits[1], logits[0]);
  EXPECT_EQ(logits[3], logits[2]);
  EXPECT_EQ(greedy[1], greedy[0]);
  EXPECT_EQ(greedy[3], greedy[2]);
  // The replayed graph really used the new ids: another prompt, other logits.
  EXPECT_GT(rel_l2(logits[2].data(), logits[0].data(), V), 1e-2);
  // Other shapes in between leave the bucket's graph as it was.
  run(100, 7u);
  run(500, 7u);
  EXPECT_EQ(run(32, 5u), logits[0]);
}

// --- continuing an existing cache ---------------------------------------------------------------

TEST(CudaPrefill, ContinuationEqualsOnePrefillOverConcatenation) {
  REQUIRE_SYNTH(m);
  const int V = m.config.vocab_size;
  auto gpu = make(m, 64);
  const std::vector<int> a = prompt_of(45, V, 11), b = prompt_of(70, V, 12);
  std::vector<int> ab(a);
  ab.insert(ab.end(), b.begin(), b.end());
  std::span<const float> l = gpu->forward_prompt(ab);
  const std::vector<float> whole(l.begin(), l.end());
  gpu->reset();
  gpu->forward_prompt(a);
  l = gpu->forward_prompt(b);
  EXPECT_EQ(gpu->position(), 115);
  const std::vector<float> cont(l.begin(), l.end());
  // Different chunk/tile shapes for the first part's tokens -> fp16 rounding differences only.
  const double e = rel_l2(cont.data(), whole.data(), V);
  EXPECT_LT(e, kBound);
  // All-logits continuation: rows of b equal the last 70 rows of one run over ab.
  gpu->reset();
  const std::vector<float> all_ab = gpu->forward_prompt_all(ab);
  gpu->reset();
  gpu->forward_prompt(a);
  const std::vector<float> all_b = gpu->forward_prompt_all(b);
  const std::vector<float> tail(all_ab.end() - (size_t)70 * V, all_ab.end());
  expect_rows_close(all_b, tail, V, "continuation all-logits");
  // A prefill continuing after decode steps: mixed use of one cache.
  gpu->reset();
  gpu->forward_prompt(std::span<const int>(ab).first(40));
  for (int i = 40; i < 45; ++i) gpu->forward_token(ab[i], i);
  l = gpu->forward_prompt(b);
  EXPECT_LT(rel_l2(l.data(), whole.data(), V), kBound);
  std::cout << "[ continuation ] rel L2 " << e << "\n";
}

// --- argmax / sampling on the GPU after a batched prefill ---------------------------------------

TEST(CudaPrefill, SampleAfterPrefillUsesPrefillLogits) {
  REQUIRE_SYNTH(m);
  const int V = m.config.vocab_size;
  auto gpu = make(m);
  const std::vector<int> toks = prompt_of(33, V, 21);
  std::span<const float> l = gpu->forward_prompt(toks);
  const int host_arg = cpu::argmax(l.data(), V);
  SamplingParams greedy;
  greedy.temp = 0;
  gpu->reset();
  const int gpu_arg = gpu->forward_prompt_sample(toks, greedy, 0.5f, {});
  EXPECT_EQ(gpu_arg, host_arg);
  EXPECT_EQ(gpu->position(), 33);
  // Decode continues at position 33 from the sampled token.
  const int next = gpu->forward_token_greedy(gpu_arg, gpu->position());
  EXPECT_GE(next, 0);
  EXPECT_LT(next, V);
  EXPECT_EQ(gpu->position(), 34);
}

// --- errors leave the cache as it was ------------------------------------------------------------

TEST(CudaPrefill, BadPromptIsAnErrorAndChangesNothing) {
  REQUIRE_SYNTH(m);
  const int V = m.config.vocab_size;
  auto gpu = make(m);
  const std::vector<int> toks = prompt_of(20, V, 5);
  std::span<const float> l = gpu->forward_prompt(toks);
  const std::vector<float> before(l.begin(), l.end());
  std::vector<int> bad = prompt_of(10, V, 6);
  bad[7] = V;  // out of range
  EXPECT_THROW(gpu->forward_prompt(bad), Error);
  EXPECT_EQ(gpu->position(), 20);
  bad[7] = -1;
  EXPECT_THROW(gpu->forward_prompt_all(bad), Error);
  EXPECT_EQ(gpu->position(), 20);
  const std::vector<int> too_long = prompt_of(kCtx - 19, V, 8);
  EXPECT_THROW(gpu->forward_prompt(too_long), Error);
  EXPECT_EQ(gpu->position(), 20);
  EXPECT_THROW(gpu->forward_prompt(std::vector<int>{}), Error);
  // The cache still holds the first prompt: continuing equals a fresh run over the whole thing.
  const std::vector<int> more = prompt_of(5, V, 9);
  l = gpu->forward_prompt(more);
  const std::vector<float> cont(l.begin(), l.end());
  std::vector<int> whole(toks);
  whole.insert(whole.end(), more.begin(), more.end());
  gpu->reset();
  l = gpu->forward_prompt(whole);
  EXPECT_LT(rel_l2(cont.data(), l.data(), V), kBound);
  EXPECT_THROW(make(m, -1), Error);  // a step of no tokens
}

// --- models outside the many-row kernels run one row per step ----------------------------------

TEST(CudaPrefill, UnsupportedModelFallsBackToDecodeSteps) {
  REQUIRE_GPU();
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  Model m = load_model(path.string());
  // Its types/shapes (tiny F32 llama2.c model) are outside what prefill_fits() takes.
  auto engine = make_cuda_batch_backend_ex(m, BatchOptions{}, CudaOptions{});
  EXPECT_EQ(engine->max_step_tokens(), 1);
  engine.reset();
  auto gpu = make_backend(m, BackendOptions{.kind = "cuda"});
  const std::vector<int> toks = {1, 403, 407, 261, 378};
  std::span<const float> l = gpu->forward_prompt(toks);
  const std::vector<float> last(l.begin(), l.end());
  EXPECT_EQ(gpu->position(), 5);
  gpu->reset();
  for (int t : toks) l = gpu->forward_token(t, gpu->position());
  // Same decode kernels in the same order: bit-identical.
  EXPECT_EQ(std::vector<float>(l.begin(), l.end()), last);
}

// --- device facts for the benchmark records ---------------------------------------------------

TEST(CudaPrefill, DeviceNameAndCopyBandwidthAreMeasured) {
  REQUIRE_SYNTH(m);
  auto gpu = make(m);
  EXPECT_FALSE(gpu->device_name().empty());
  EXPECT_NE(gpu->device_name(), "cpu");
  const double bw = gpu->copy_bandwidth_gbs();
  std::cout << "[ device ] " << gpu->device_name() << ", copy bandwidth " << bw << " GB/s\n";
  // Any current NVIDIA datacenter GPU copies device-to-device at > 100 GB/s (H100: ~2-3 TB/s
  // read+write); 100 000 GB/s would mean a broken timer.
  EXPECT_GT(bw, 100.0);
  EXPECT_LT(bw, 100000.0);
}

}  // namespace
}  // namespace smolrt
