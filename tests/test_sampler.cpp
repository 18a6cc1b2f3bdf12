// Sampler: parameter checks, masks and penalties on fixed logits, the sampled distribution
// against an independent computation (chi-square), seed reproducibility, the Backend seam.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/sample.h"
#include "core/error.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace smolrt {
namespace {

SamplingParams plain(float temp = 1.0f) {  // every filter off
  SamplingParams p;
  p.temp = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  return p;
}

void expect_invalid(SamplingParams p, const std::string& flag) {
  try {
    validate(p);
    ADD_FAILURE() << "no error for " << flag;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
  }
}

TEST(SamplerParams, DefaultsAreLlamaCppsAndValid) {
  SamplingParams p;
  EXPECT_FLOAT_EQ(p.temp, 0.8f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repeat_penalty, 1.0f);
  EXPECT_EQ(p.repeat_last_n, 64);
  EXPECT_NO_THROW(validate(p));
}

TEST(SamplerParams, BadValuesNameTheFlag) {
  SamplingParams p;
  p.temp = -0.1f;
  expect_invalid(p, "--temp");
  p = {};
  p.temp = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(p, "--temp");
  p = {};
  p.top_k = -1;
  expect_invalid(p, "--top-k");
  p = {};
  p.top_p = 0.0f;
  expect_invalid(p, "--top-p");
  p.top_p = 1.01f;
  expect_invalid(p, "--top-p");
  p = {};
  p.min_p = -0.01f;
  expect_invalid(p, "--min-p");
  p.min_p = 1.5f;
  expect_invalid(p, "--min-p");
  p = {};
  p.repeat_penalty = 0.0f;
  expect_invalid(p, "--repeat-penalty");
  p = {};
  p.repeat_last_n = -2;
  expect_invalid(p, "--repeat-last-n");
  p = {};
  p.seed = -5;
  expect_invalid(p, "--seed");
  p = {};
  p.top_p = 1.0f;  // edges of the valid ranges
  p.min_p = 1.0f;
  p.temp = 0.0f;
  EXPECT_NO_THROW(validate(p));
  p.seed = -1;
  EXPECT_NO_THROW(TokenSampler{p});
}

TEST(SamplerPenalties, RepeatPresenceFrequencyOnFixedLogits) {
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  const std::vector<int> hist = {0, 0, 1, 3};
  SamplingParams p = plain();
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  std::vector<int> scratch;
  cpu::apply_penalties(l.data(), 4, hist, p, scratch);
  EXPECT_FLOAT_EQ(l[0], 2.0f / 2 - (2 * 0.5f + 0.25f));   // positive: divided; seen twice
  EXPECT_FLOAT_EQ(l[1], -1.0f * 2 - (1 * 0.5f + 0.25f));  // negative: multiplied
  EXPECT_FLOAT_EQ(l[2], 0.5f);                            // not in history
  EXPECT_FLOAT_EQ(l[3], 3.0f / 2 - (1 * 0.5f + 0.25f));
}

TEST(SamplerPenalties, OnlyTheLastNTokensCount) {
  std::vector<float> l = {1.0f, 1.0f, 1.0f};
  SamplingParams p = plain();
  p.repeat_penalty = 4.0f;
  p.repeat_last_n = 2;
  std::vector<int> scratch;
  cpu::apply_penalties(l.data(), 3, std::vector<int>{0, 1, 1}, p, scratch);
  EXPECT_FLOAT_EQ(l[0], 1.0f);  // outside the window
  EXPECT_FLOAT_EQ(l[1], 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
  p.repeat_last_n = 0;  // off
  std::vector<float> l2 = {1.0f, 1.0f, 1.0f};
  cpu::apply_penalties(l2.data(), 3, std::vector<int>{0, 1}, p, scratch);
  EXPECT_EQ(l2, (std::vector<float>{1.0f, 1.0f, 1.0f}));
}

TEST(SamplerPenalties, OutOfRangeHistoryIsAnError) {
  std::vector<float> l = {1.0f, 1.0f};
  SamplingParams p = plain();
  p.repeat_penalty = 1.1f;
  std::vector<int> scratch;
  EXPECT_THROW(cpu::apply_penalties(l.data(), 2, std::vector<int>{5}, p, scratch), Error);
}

TEST(SamplerGreedy, TempZeroIsArgmaxAfterPenalties) {
  const std::vector<float> l = {0.1f, 2.0f, 1.9f, 2.0f, -3.0f};
  SamplingParams p = plain(0.0f);
  cpu::SampleScratch s;
  EXPECT_EQ(cpu::sample(l, p, 0.99f, {}, s), 1);  // tie 1/3 -> lowest id; u ignored
  p.repeat_penalty = 1.5f;
  const std::vector<int> hist = {1, 3};
  EXPECT_EQ(cpu::sample(l, p, 0.0f, hist, s), 2);  // 2.0/1.5 < 1.9
}

// Probabilities of 5 tokens written as logits: 0.5 0.2 0.15 0.1 0.05.
std::vector<float> five() {
  return {std::log(0.2f), std::log(0.05f), std::log(0.5f), std::log(0.1f), std::log(0.15f)};
}

TEST(SamplerMasks, TopKKeepsTheKLargestInOrderTiesByLowestId) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f, 2.5f};
  SamplingParams p = plain();
  p.top_k = 3;
  std::vector<int> ids;
  std::vector<float> probs;
  cpu::candidates(l.data(), 6, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{1, 3, 5}));
  p.top_k = 100;  // larger than the vocabulary: everything, in id order (core/sampling.h step 8)
  cpu::candidates(l.data(), 6, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(SamplerMasks, TopPKeepsTheShortestPrefixReachingP) {
  const std::vector<float> l = five();
  SamplingParams p = plain();
  std::vector<int> ids;
  std::vector<float> probs;
  // Top-k off: the kept ids come in id order (the walk order, core/sampling.h step 8).
  p.top_p = 0.75f;  // 0.5, 0.7, 0.85 -> 3 tokens
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{0, 2, 4}));
  p.top_p = 0.65f;  // 0.5, 0.7 -> 2 tokens
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{0, 2}));
  p.top_k = 4;  // a top-k cut: the sorted order
  p.top_p = 0.75f;
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{2, 0, 4}));
  p.top_k = 0;
  p.top_p = 0.1f;  // the top token alone already covers it
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{2}));
  // top-p sees probabilities before temperature: a high temperature does not change the mask.
  p.top_p = 0.75f;
  p.temp = 5.0f;
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids.size(), 3u);
}

TEST(SamplerMasks, MinPIsRelativeToTheTopProbability) {
  const std::vector<float> l = five();
  SamplingParams p = plain();
  std::vector<int> ids;
  std::vector<float> probs;
  p.min_p = 0.25f;  // threshold 0.125: 0.5, 0.2, 0.15 (in id order: top-k is off)
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{0, 2, 4}));
  p.min_p = 0.35f;  // threshold 0.175: 0.5, 0.2
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{0, 2}));
  p.min_p = 1.0f;  // only the top token
  cpu::candidates(l.data(), 5, p, ids, probs);
  EXPECT_EQ(ids, (std::vector<int>{2}));
}

TEST(SamplerMasks, TemperatureReshapesTheKeptProbabilities) {
  const std::vector<float> l = five();
  SamplingParams p = plain(0.5f);
  p.top_k = 2;
  std::vector<int> ids;
  std::vector<float> probs;
  cpu::candidates(l.data(), 5, p, ids, probs);
  ASSERT_EQ(ids.size(), 2u);
  // softmax(log(0.5)/0.5, log(0.2)/0.5) = 0.25 : 0.04 normalized.
  EXPECT_NEAR(probs[0], 0.25 / 0.29, 1e-6);
  EXPECT_NEAR(probs[1], 0.04 / 0.29, 1e-6);
}

// A top-k cut walks the candidates sorted: top-k 4 keeps 0.5 0.2 0.15 0.1 (ids 2 0 4 3) of 0.95,
// cumulative 0.526 0.737 0.895 1. With top-k off a cut (here top-p 0.9, keeping 2 0 4 3 too)
// walks them in id order: 0.2 0.5 0.1 0.15 of 0.95 (ids 0 2 3 4), cumulative 0.211 0.737 0.842 1.
TEST(SamplerPick, DrawWalksTheCumulativeDistribution) {
  const std::vector<float> l = five();
  SamplingParams p = plain();
  p.top_k = 4;
  cpu::SampleScratch s;
  EXPECT_EQ(cpu::sample(l, p, 0.0f, {}, s), 2);
  EXPECT_EQ(cpu::sample(l, p, 0.52f, {}, s), 2);
  EXPECT_EQ(cpu::sample(l, p, 0.53f, {}, s), 0);
  EXPECT_EQ(cpu::sample(l, p, 0.73f, {}, s), 0);
  EXPECT_EQ(cpu::sample(l, p, 0.74f, {}, s), 4);
  EXPECT_EQ(cpu::sample(l, p, 0.89f, {}, s), 4);
  EXPECT_EQ(cpu::sample(l, p, 0.9f, {}, s), 3);
  EXPECT_EQ(cpu::sample(l, p, std::nextafter(1.0f, 0.0f), {}, s), 3);
  p = plain();
  p.top_p = 0.9f;
  EXPECT_EQ(cpu::sample(l, p, 0.0f, {}, s), 0);
  EXPECT_EQ(cpu::sample(l, p, 0.2f, {}, s), 0);
  EXPECT_EQ(cpu::sample(l, p, 0.22f, {}, s), 2);
  EXPECT_EQ(cpu::sample(l, p, 0.73f, {}, s), 2);
  EXPECT_EQ(cpu::sample(l, p, 0.74f, {}, s), 3);
  EXPECT_EQ(cpu::sample(l, p, 0.85f, {}, s), 4);
  EXPECT_EQ(cpu::sample(l, p, std::nextafter(1.0f, 0.0f), {}, s), 4);
}

// Nothing cut (top-k off or at least the vocabulary, top-p 1, min-p 0): the walk in id order,
// 0.2 0.05 0.5 0.1 0.15 (core/sampling.h step 8), NaN ids skipped.
TEST(SamplerPick, NothingCutWalksIdsInOrder) {
  std::vector<float> l = five();
  cpu::SampleScratch s;
  for (int top_k : {0, 5, 100}) {
    SamplingParams p = plain();
    p.top_k = top_k;
    EXPECT_EQ(cpu::sample(l, p, 0.0f, {}, s), 0) << top_k;
    EXPECT_EQ(cpu::sample(l, p, 0.19f, {}, s), 0);
    EXPECT_EQ(cpu::sample(l, p, 0.21f, {}, s), 1);
    EXPECT_EQ(cpu::sample(l, p, 0.26f, {}, s), 2);
    EXPECT_EQ(cpu::sample(l, p, 0.74f, {}, s), 2);
    EXPECT_EQ(cpu::sample(l, p, 0.76f, {}, s), 3);
    EXPECT_EQ(cpu::sample(l, p, 0.86f, {}, s), 4);
    EXPECT_EQ(cpu::sample(l, p, std::nextafter(1.0f, 0.0f), {}, s), 4);
  }
  SamplingParams p = plain();
  p.top_k = 4;  // a cut: the sorted walk (0.5 0.2 0.15 0.1 of 0.95)
  EXPECT_EQ(cpu::sample(l, p, 0.0f, {}, s), 2);
  l[2] = std::numeric_limits<float>::quiet_NaN();  // 0.2 0.05 - 0.1 0.15, of 0.5
  p = plain();
  EXPECT_EQ(cpu::sample(l, p, 0.45f, {}, s), 1);
  EXPECT_EQ(cpu::sample(l, p, 0.55f, {}, s), 3);
  EXPECT_EQ(cpu::sample(l, p, 0.71f, {}, s), 4);
  // temp 0.5 squares them: 0.04 0.0025 - 0.01 0.0225 of 0.075, cumulative 0.533 0.567 - 0.7 1
  p.temp = 0.5f;
  EXPECT_EQ(cpu::sample(l, p, 0.5f, {}, s), 0);
  EXPECT_EQ(cpu::sample(l, p, 0.55f, {}, s), 1);
  EXPECT_EQ(cpu::sample(l, p, 0.6f, {}, s), 3);
}

TEST(SamplerPick, NaNLogitsAreNeverSampled) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> l = {nan, 0.0f, nan, 0.0f};
  SamplingParams p = plain();
  cpu::SampleScratch s;
  for (float u : {0.0f, 0.3f, 0.7f, 0.999f}) {
    const int t = cpu::sample(l, p, u, {}, s);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

// An infinite top logit leaves no distribution (exp(l - l_max) is NaN at +inf): the lowest id at
// it is the pick, as greedy's, for every draw and filter; -inf elsewhere is never drawn.
TEST(SamplerPick, AnInfiniteTopLogitIsThePick) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> plus = {0.5f, nan, inf, 3.0f, inf, -inf};
  const std::vector<float> minus = {nan, -inf, -inf, nan};
  cpu::SampleScratch s;
  for (const int top_k : {0, 2, 40})
    for (const float top_p : {1.0f, 0.9f})
      for (const float min_p : {0.0f, 0.1f})
        for (const float u : {0.0f, 0.5f, 0.999f}) {
          SamplingParams p = plain();
          p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
          EXPECT_EQ(cpu::sample(plus, p, u, {}, s), 2) << top_k << " " << top_p << " " << min_p;
          EXPECT_EQ(cpu::sample(minus, p, u, {}, s), 1) << top_k << " " << top_p << " " << min_p;
        }
  SamplingParams p = plain();
  p.temp = 0.0f;
  EXPECT_EQ(cpu::sample(plus, p, 0.5f, {}, s), 2);  // greedy agrees
}

// An independent, naive implementation of backend/sampling.h steps 1-7 on a small vocabulary.
std::vector<double> reference_probs(std::vector<float> l, const std::vector<int>& hist,
                                    const SamplingParams& p) {
  const int n = static_cast<int>(l.size());
  std::map<int, int> count;
  const size_t from =
      hist.size() > static_cast<size_t>(p.repeat_last_n) ? hist.size() - p.repeat_last_n : 0;
  for (size_t i = from; i < hist.size(); ++i) count[hist[i]]++;
  for (auto [t, c] : count) {
    l[t] = l[t] > 0 ? l[t] / p.repeat_penalty : l[t] * p.repeat_penalty;
    l[t] -= c * p.frequency_penalty + p.presence_penalty;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  std::vector<bool> keep(n, false);
  size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, n) : n;
  double z = 0;
  for (size_t i = 0; i < k; ++i) z += std::exp(double(l[order[i]]) - l[order[0]]);
  double cum = 0;
  for (size_t i = 0; i < k; ++i) {
    const double pi = std::exp(double(l[order[i]]) - l[order[0]]) / z;
    const bool min_ok = pi / (1.0 / z) >= p.min_p;  // p_max = 1/z
    if (!min_ok && i > 0) break;
    keep[order[i]] = true;
    cum += pi;
    if (cum >= p.top_p) break;
  }
  std::vector<double> out(n, 0.0);
  double zt = 0;
  for (int t = 0; t < n; ++t)
    if (keep[t]) zt += out[t] = std::exp((double(l[t]) - l[order[0]]) / p.temp);
  for (double& v : out) v /= zt;
  return out;
}

// Top-k off with min-p and top-p (top-p's cut found by sorting only the bin of weights where its
// mass is reached): the kept set and probabilities equal the naive reference that sorts
// everything, on a flat spread (top-p sets of thousands), a peaked one (a few ids) and logits on a
// grid of 1/8 (the cut inside a tie keeps its lowest ids).
TEST(SamplerMasks, TopKOffWithTopPAndMinPMatchesTheNaiveReference) {
  for (const float spread : {2.0f, 6.0f, -2.0f})
    for (float top_p : {1.0f, 0.9995f, 0.9f, 0.5f}) {
      std::vector<float> l = test::randn(3000, 21, std::abs(spread));
      if (spread < 0)
        for (float& v : l) v = std::round(v * 8.0f) / 8.0f;
      for (float min_p : {0.0f, 0.01f, 0.1f, 0.5f}) {
        SamplingParams p = plain(0.9f);
        p.top_p = top_p;
        p.min_p = min_p;
        p.repeat_last_n = 0;
        const std::vector<double> ref = reference_probs(l, {}, p);
        std::vector<int> ids;
        std::vector<float> probs;
        cpu::candidates(l.data(), static_cast<int>(l.size()), p, ids, probs);
        std::vector<int> ref_ids;
        for (size_t t = 0; t < ref.size(); ++t)
          if (ref[t] > 0) ref_ids.push_back(static_cast<int>(t));
        std::vector<int> sorted_ids = ids;
        std::sort(sorted_ids.begin(), sorted_ids.end());
        ASSERT_EQ(sorted_ids, ref_ids)
            << "spread " << spread << " top_p " << top_p << " min_p " << min_p;
        for (size_t i = 0; i < ids.size(); ++i) EXPECT_NEAR(probs[i], ref[ids[i]], 1e-5);
      }
    }
}

TEST(SamplerDistribution, FrequenciesMatchTheProcessedSoftmax) {
  const std::vector<float> l = test::randn(24, 7, 0.8f);
  const std::vector<int> hist = {3, 3, 5, 11, 20, 3};
  SamplingParams p;
  p.temp = 0.7f;
  p.top_k = 12;
  p.top_p = 0.95f;
  p.min_p = 0.03f;
  p.repeat_penalty = 1.3f;
  p.repeat_last_n = 5;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  p.seed = 20261121;
  const std::vector<double> expect = reference_probs(l, hist, p);
  int n_kept = 0;
  for (double e : expect) n_kept += e > 0;
  ASSERT_GE(n_kept, 4) << "the test needs a non-trivial distribution";

  TokenSampler sampler(p);
  sampler.accept(hist);
  const int draws = 200000;
  std::vector<int> seen(l.size(), 0);
  for (int i = 0; i < draws; ++i) seen[sampler.sample(l)]++;
  double chi2 = 0;
  for (size_t t = 0; t < l.size(); ++t) {
    if (expect[t] == 0) {
      EXPECT_EQ(seen[t], 0) << "token " << t << " is masked but was sampled";
      continue;
    }
    const double e = expect[t] * draws;
    chi2 += (seen[t] - e) * (seen[t] - e) / e;
  }
  // Chi-square with n_kept-1 degrees of freedom: mean df, sd sqrt(2 df). mean + 6 sd is far in
  // the tail (p < 1e-5) for a correct sampler; a wrong mask or temperature gives chi2 in the
  // thousands at 200k draws. The seed is fixed, so the result is deterministic.
  const double df = n_kept - 1;
  EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df)) << "kept " << n_kept;
}

TEST(SamplerSeed, SameSeedSameTokensDifferentSeedDifferent) {
  const std::vector<float> l = test::randn(64, 3, 2.0f);
  SamplingParams p;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  auto run = [&](int64_t seed) {
    p.seed = seed;
    TokenSampler s(p);
    std::vector<int> out;
    for (int i = 0; i < 500; ++i) {
      out.push_back(s.sample(l));
      s.accept(out.back());
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  p.seed = 42;
  TokenSampler a(p), b(p);
  EXPECT_EQ(a.seed(), 42u);
  for (int i = 0; i < 100; ++i) {
    const float u = a.draw();
    EXPECT_EQ(u, b.draw());
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
  }
}

// A backend whose logits are a fixed function of (token, pos): enough for the default seam.
class FixedLogitsBackend final : public Backend {
 public:
  explicit FixedLogitsBackend(int vocab) {
    cfg_.vocab_size = vocab;
    logits_.resize(vocab);
  }
  std::string name() const override { return "fixed"; }
  const ModelConfig& config() const override { return cfg_; }
  int n_ctx() const override { return 64; }
  int position() const override { return pos_; }
  void reset() override { pos_ = 0; }
  void rollback(int pos) override { pos_ = pos; }
  std::span<const float> forward_token(int token, int pos) override {
    logits_ = test::randn(logits_.size(), 1000u * token + pos);
    pos_ = pos + 1;
    return logits_;
  }
  std::span<const float> forward_prompt(std::span<const int> tokens) override {
    std::span<const float> out;
    for (int t : tokens) out = forward_token(t, pos_);
    return out;
  }
  std::vector<float> forward_prompt_all(std::span<const int>) override { return {}; }

 private:
  ModelConfig cfg_;
  int pos_ = 0;
  std::vector<float> logits_;
};

TEST(SamplerBackendSeam, DefaultSampleStepEqualsCpuSampleOnTheLogits) {
  FixedLogitsBackend be(50);
  SamplingParams p;
  p.repeat_penalty = 1.2f;
  const std::vector<int> hist = {4, 9, 9};
  cpu::SampleScratch s;
  for (float u : {0.05f, 0.5f, 0.93f}) {
    be.reset();
    const int via_seam = be.forward_token_sample(7, 0, p, u, hist);
    be.reset();
    std::span<const float> step = be.forward_token(7, 0);
    const std::vector<float> l(step.begin(), step.end());
    EXPECT_EQ(via_seam, cpu::sample(l, p, u, hist, s));
  }
  be.reset();
  const std::vector<int> prompt = {1, 2, 3};
  const int a = be.forward_prompt_sample(prompt, p, 0.4f, hist);
  EXPECT_EQ(be.position(), 3);
  be.reset();
  std::span<const float> last = be.forward_prompt(prompt);
  EXPECT_EQ(a, cpu::sample(last, p, 0.4f, hist, s));
}

}  // namespace
}  // namespace smolrt
