#include "backend/cpu/sample.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace smolrt::cpu {

namespace {
// Same contract as cpu::argmax (ties -> lowest index, NaN never wins, all-NaN -> 0); kept local
// so the sampler does not pull the whole op set into tools that only sample.
int greedy_pick(const float* x, int n) {
  int best = 0;
  bool found = false;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (!found || x[i] > x[best]) {
      best = i;
      found = true;
    }
  }
  return best;
}
}  // namespace

std::span<const int> penalty_window(std::span<const int> history, const SamplingParams& p) {
  if (p.repeat_last_n == 0) return {};
  if (p.repeat_last_n < 0 || static_cast<size_t>(p.repeat_last_n) >= history.size()) {
    return history;
  }
  return history.subspan(history.size() - static_cast<size_t>(p.repeat_last_n));
}

void apply_penalties(float* logits, int n, std::span<const int> history, const SamplingParams& p,
                     std::vector<int>& window) {
  if (!p.has_penalties()) return;
  std::span<const int> w = penalty_window(history, p);
  window.assign(w.begin(), w.end());
  for (int t : window) {
    if (t < 0 || t >= n) {
      fail("token id ", t, " in the sampling history is out of range (vocabulary of ", n,
           " tokens)");
    }
  }
  // Sorting groups repeats so each distinct token is penalized once with its count.
  std::sort(window.begin(), window.end());
  for (size_t i = 0; i < window.size();) {
    size_t j = i;
    while (j < window.size() && window[j] == window[i]) ++j;
    const int t = window[i];
    const float count = static_cast<float>(j - i);
    float& l = logits[t];
    l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= count * p.frequency_penalty + p.presence_penalty;
    i = j;
  }
}

namespace {
// Step 5's weight of a logit: exp(l - l_max) in units of 2^-32 (core/sampling.h).
uint64_t p_weight(float l, float l_max) {
  return static_cast<uint64_t>(std::exp(l - l_max) * 0x1p32f);
}
// Step 5's mass to reach: ceil(top_p * z), at most z.
uint64_t top_p_target(uint64_t z, float top_p) {
  return std::min(z, static_cast<uint64_t>(std::ceil(double(top_p) * double(z))));
}

// Step 3's order: logit descending, ties by id ascending.
struct Before {
  const float* logits;
  bool operator()(int a, int b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Top-k cuts (k below the valid tokens): steps 4-7 on the sorted candidates.
void sorted_candidates(const float* logits, const SamplingParams& p, std::vector<int>& ids,
                       std::vector<float>& probs) {
  const auto k = static_cast<std::ptrdiff_t>(p.top_k);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), Before{logits});
  ids.resize(static_cast<size_t>(k));
  const float l_max = logits[ids[0]];
  if (p.top_p < 1.0f) {
    uint64_t z = 0;
    for (int id : ids) z += p_weight(logits[id], l_max);
    const uint64_t target = top_p_target(z, p.top_p);
    uint64_t cum = 0;
    size_t keep = 0;
    while (keep < ids.size() && cum < target) cum += p_weight(logits[ids[keep++]], l_max);
    ids.resize(keep);
  }
  // min-p: p_i / p_max >= min_p  <=>  l_i >= l_max + log(min_p).
  if (p.min_p > 0.0f) {
    const float threshold = l_max + std::log(p.min_p);
    size_t keep = 1;
    while (keep < ids.size() && logits[ids[keep]] >= threshold) ++keep;
    ids.resize(keep);
  }
  probs.resize(ids.size());
  const float inv_t = 1.0f / p.temp;
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp((logits[ids[i]] - l_max) * inv_t);
    sum += probs[i];
  }
  for (float& q : probs) q = static_cast<float>(q / sum);
}

// Top-p's cut with top-k off: the kept set is every token above logit v and the first `ties`
// ids at v. The weights are binned by their distance below the top logit (a bin is a run of the
// sorted order), so only the bin where the mass reaches the target is sorted.
void top_p_cut(const float* logits, int n, float l_max, float top_p, std::vector<int>& bin_ids,
               float& v, int& ties) {
  constexpr int kBins = 512;
  constexpr float kPerUnit = kBins / 32.0f;  // bins cover logits within 32 of the top
  auto bin_of = [&](float l) {
    const float d = (l_max - l) * kPerUnit;
    return d < kBins ? static_cast<int>(d) : kBins;
  };
  std::array<uint64_t, kBins + 1> mass{};
  uint64_t z = 0;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) continue;
    const uint64_t w = p_weight(logits[i], l_max);
    mass[bin_of(logits[i])] += w;
    z += w;
  }
  const uint64_t target = top_p_target(z, top_p);
  uint64_t cum = 0;
  int b = 0;
  while (cum + mass[b] < target) cum += mass[b++];
  bin_ids.clear();
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(logits[i]) && bin_of(logits[i]) == b) bin_ids.push_back(i);
  }
  std::sort(bin_ids.begin(), bin_ids.end(), Before{logits});
  ties = 0;
  for (int id : bin_ids) {
    ties = logits[id] == v ? ties + 1 : 1;
    v = logits[id];
    if ((cum += p_weight(v, l_max)) >= target) return;
  }
}
}  // namespace

void candidates(const float* logits, int n, const SamplingParams& p, std::vector<int>& ids,
                std::vector<float>& probs) {
  ids.clear();
  probs.clear();
  int valid = 0, first = -1;
  float l_max = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) continue;
    if (first < 0) first = i;
    ++valid;
    l_max = std::max(l_max, logits[i]);
  }
  if (valid == 0) return;
  if (std::isinf(l_max)) {
    // Every logit -inf, or some +inf (exp(l - l_max) is NaN there): no distribution to speak of;
    // the lowest id at l_max is the only pick, as greedy's.
    while (logits[first] != l_max) ++first;
    ids.assign(1, first);
    probs.assign(1, 1.0f);
    return;
  }
  if (p.top_k > 0 && p.top_k < valid) {
    for (int i = 0; i < n; ++i) {
      if (!std::isnan(logits[i])) ids.push_back(i);
    }
    sorted_candidates(logits, p, ids, probs);
    return;
  }
  // Top-k off: top-p and min-p cut the sorted order at a logit (ties at top-p's in id order), and
  // the walk goes in id order over the kept tokens of nonzero weight (step 8).
  float v = -std::numeric_limits<float>::infinity();
  int ties = std::numeric_limits<int>::max();
  if (p.top_p < 1.0f) top_p_cut(logits, n, l_max, p.top_p, ids, v, ties);
  const float min_l = p.min_p > 0.0f ? l_max + std::log(p.min_p) : v;
  ids.clear();
  const float inv_t = 1.0f / p.temp;
  double sum = 0.0;  // tens of thousands of terms: a float sum drifts by whole token widths
  for (int i = 0; i < n; ++i) {
    const float l = logits[i];
    if (!(l >= v && l >= min_l)) continue;  // NaN fails too
    if (l == v && ties-- <= 0) continue;
    const float e = std::exp((l - l_max) * inv_t);
    if (e == 0.0f) continue;
    ids.push_back(i);
    probs.push_back(e);
    sum += e;
  }
  for (float& q : probs) q = static_cast<float>(q / sum);
}

int sample(std::span<const float> logits, const SamplingParams& p, float u,
           std::span<const int> history, SampleScratch& s) {
  const int n = static_cast<int>(logits.size());
  if (n <= 0) fail("cannot sample from an empty logit vector");
  const float* l = logits.data();
  if (p.has_penalties()) {
    s.logits.assign(logits.begin(), logits.end());
    apply_penalties(s.logits.data(), n, history, p, s.window);
    l = s.logits.data();
  }
  if (p.greedy()) return greedy_pick(l, n);
  candidates(l, n, p, s.ids, s.probs);
  if (s.ids.empty()) return 0;  // all NaN: same answer as argmax
  // probs sum to 1 up to rounding; compare against u * (their actual sum) so u -> 1 stays inside.
  // Double sums: a float sum over a vocabulary drifts by more than a token's width.
  double total = 0.0;
  for (float q : s.probs) total += q;
  const double target = u * total;
  double cum = 0.0;
  for (size_t i = 0; i < s.ids.size(); ++i) {
    cum += s.probs[i];
    if (cum > target) return s.ids[i];
  }
  return s.ids.back();
}

}  // namespace smolrt::cpu
