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

void candidates(const float* logits, int n, const SamplingParams& p, std::vector<int>& ids,
                std::vector<float>& probs) {
  ids.clear();
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(logits[i])) ids.push_back(i);
  }
  probs.clear();
  if (ids.empty()) return;
  auto before = [logits](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const size_t k = p.top_k > 0 ? std::min(ids.size(), static_cast<size_t>(p.top_k)) : ids.size();
  float z_all = -1.0f;  // top-p denominator over every token, when taken before a min-p prefilter
  if (k < ids.size()) {
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), before);
    ids.resize(k);
  } else {
    // Top-k off: sort only the tokens that can survive, those at or above the min-p cut (min-p
    // comes last and the top token stays first) or, top-p alone, those above a logit cut that
    // keeps a little more than top_p of the mass (one pass bins the weights by their distance
    // below the top logit: a prefix of the sorted order holding the kept set). Sorting a whole
    // vocabulary per token would dominate sampling; top-p still normalizes over every token.
    float l_top = -std::numeric_limits<float>::infinity();
    if (p.min_p > 0.0f || p.top_p < 1.0f)
      for (int id : ids) l_top = std::max(l_top, logits[id]);
    if (l_top != -std::numeric_limits<float>::infinity()) {
      if (p.top_p < 1.0f) {
        probs.resize(ids.size());
        z_all = 0.0f;
        for (size_t i = 0; i < ids.size(); ++i)
          z_all += probs[i] = std::exp(logits[ids[i]] - l_top);
      }
      if (p.min_p > 0.0f) {
        const float thr = l_top + std::log(p.min_p);
        std::erase_if(ids, [&](int id) { return logits[id] < thr; });
      } else {
        constexpr int kBins = 512;
        constexpr float kPerUnit = kBins / 32.0f;  // bins cover logits within 32 of the top
        auto bin_of = [&](float l) {
          const float d = (l_top - l) * kPerUnit;
          return d < kBins ? static_cast<int>(d) : kBins;
        };
        std::array<double, kBins + 1> mass{};
        for (size_t i = 0; i < ids.size(); ++i) mass[bin_of(logits[ids[i]])] += probs[i];
        // 0.1% over top_p: the float sums of the top-p step below then surely reach it inside.
        const double want = std::min(1.0, 1.001 * p.top_p) * z_all;
        double acc = 0.0;
        int b = 0;
        for (; b < kBins; ++b)
          if ((acc += mass[b]) >= want) break;
        if (b < kBins) std::erase_if(ids, [&](int id) { return bin_of(logits[id]) > b; });
      }
    }
    std::sort(ids.begin(), ids.end(), before);
  }
  const float l_max = logits[ids[0]];
  if (l_max == -std::numeric_limits<float>::infinity()) {
    // Every logit is -inf: no distribution to speak of; the first candidate is the only pick.
    ids.resize(1);
    probs.assign(1, 1.0f);
    return;
  }

  // top-p over the softmax without temperature.
  if (p.top_p < 1.0f) {
    probs.resize(ids.size());
    float sum = 0.0f;
    for (size_t i = 0; i < ids.size(); ++i) {
      probs[i] = std::exp(logits[ids[i]] - l_max);
      sum += probs[i];
    }
    if (z_all >= 0.0f) sum = z_all;
    float cum = 0.0f;
    size_t keep = ids.size();
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += probs[i] / sum;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    ids.resize(keep);
  }

  // min-p: p_i / p_max >= min_p  <=>  l_i >= l_max + log(min_p).
  if (p.min_p > 0.0f) {
    const float threshold = l_max + std::log(p.min_p);
    size_t keep = 1;
    while (keep < ids.size() && logits[ids[keep]] >= threshold) ++keep;
    ids.resize(keep);
  }

  // Temperature, then the final distribution.
  probs.resize(ids.size());
  const float inv_t = 1.0f / p.temp;
  float sum = 0.0f;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp((logits[ids[i]] - l_max) * inv_t);
    sum += probs[i];
  }
  for (float& q : probs) q /= sum;
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
  if (p.top_p >= 1.0f && p.min_p <= 0.0f) {
    // Nothing cut when top-k is off or keeps every valid token: the walk in id order (step 8).
    int valid = 0;
    float l_max = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) {
      if (std::isnan(l[i])) continue;
      ++valid;
      l_max = std::max(l_max, l[i]);
    }
    if (valid == 0) return 0;  // all NaN: same answer as argmax
    if (p.top_k <= 0 || p.top_k >= valid) {
      if (l_max == -std::numeric_limits<float>::infinity()) return greedy_pick(l, n);
      const float inv_t = 1.0f / p.temp;
      float total = 0.0f;
      int last = 0;
      for (int i = 0; i < n; ++i) {
        if (std::isnan(l[i])) continue;
        const float e = std::exp((l[i] - l_max) * inv_t);
        total += e;
        if (e > 0.0f) last = i;  // rounding leaving no crossing: the last id of nonzero weight
      }
      const float target = u * total;
      float cum = 0.0f;
      for (int i = 0; i < n; ++i) {
        if (std::isnan(l[i])) continue;
        cum += std::exp((l[i] - l_max) * inv_t);
        if (cum > target) return i;
      }
      return last;
    }
  }
  candidates(l, n, p, s.ids, s.probs);
  if (s.ids.empty()) return 0;  // all NaN: same answer as argmax
  // probs sum to 1 up to rounding; compare against u * (their actual sum) so u -> 1 stays inside.
  float total = 0.0f;
  for (float q : s.probs) total += q;
  const float target = u * total;
  float cum = 0.0f;
  for (size_t i = 0; i < s.ids.size(); ++i) {
    cum += s.probs[i];
    if (cum > target) return s.ids[i];
  }
  return s.ids.back();
}

}  // namespace smolrt::cpu
