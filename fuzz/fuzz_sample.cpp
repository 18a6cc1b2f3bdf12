// libFuzzer target: the CPU sampler (cpu::sample, the GPU kernel's twin) on any logits (raw float
// bits: NaN, +-inf, denormals, huge values), parameters across their valid ranges, penalty
// histories and draws. Checked: the pick is an id of the vocabulary; it is not a NaN logit unless
// every logit is; it is one of cpu::candidates' kept ids, which equal a naive reference of
// core/sampling.h steps 3-6 (sort everything, integer top-p weights, the min-p cut) as a set, in
// the walk order (sorted under a top-k cut, ids ascending otherwise). Error is never thrown for
// valid parameters.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/sample.h"
#include "core/sampling.h"

namespace {

using namespace smolrt;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

struct Bytes {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return v;
  }
  template <class T, size_t N>
  T pick(const T (&options)[N]) {
    return options[u8() % N];
  }
};

// Steps 3-6 the plain way, on penalized logits: the kept ids in walk order.
std::vector<int> reference(const std::vector<float>& l, const SamplingParams& p) {
  const int n = static_cast<int>(l.size());
  std::vector<int> order;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(l[i])) order.push_back(i);
  if (order.empty()) return {};
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  const float l_max = l[order[0]];
  if (std::isinf(l_max)) return {order[0]};
  const bool top_k_cuts = p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size();
  if (top_k_cuts) order.resize(static_cast<size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    auto w = [&](int id) { return static_cast<uint64_t>(std::exp(l[id] - l_max) * 0x1p32f); };
    uint64_t z = 0;
    for (int id : order) z += w(id);
    const uint64_t target =
        std::min(z, static_cast<uint64_t>(std::ceil(double(p.top_p) * double(z))));
    uint64_t cum = 0;
    size_t keep = 0;
    while (keep < order.size() && cum < target) cum += w(order[keep++]);
    order.resize(keep);
  }
  if (p.min_p > 0.0f) {
    const float thr = l_max + std::log(p.min_p);
    size_t keep = 1;
    while (keep < order.size() && l[order[keep]] >= thr) ++keep;
    order.resize(keep);
  }
  if (!top_k_cuts) {
    // The id-order walk: weightless tokens are never drawn and not listed.
    std::erase_if(order,
                  [&](int id) { return std::exp((l[id] - l_max) * (1.0f / p.temp)) == 0.0f; });
    std::sort(order.begin(), order.end());
  }
  return order;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in{data, size};
  SamplingParams p;
  p.temp = in.pick({0.0f, 1e-30f, 0.1f, 0.7f, 1.0f, 2.0f, 100.0f});
  p.top_p = in.pick({1.0f, 0.999f, 0.9f, 0.5f, 1e-6f});
  p.min_p = in.pick({0.0f, 1e-6f, 0.05f, 0.5f, 1.0f});
  p.repeat_penalty = in.pick({1.0f, 1.0f, 1.3f, 0.5f, 1e-30f});
  p.presence_penalty = in.pick({0.0f, 0.0f, 0.5f, -2.0f});
  p.frequency_penalty = in.pick({0.0f, 0.0f, 0.3f, 2.0f});
  p.repeat_last_n = in.pick({64, 0, -1, 3});
  const int n = 1 + in.u8() % 96 + (in.u8() & 1) * 400;
  const int k_choice = in.u8() % 7;
  const int top_ks[] = {0, 1, 2, 5, 40, n, n + 1};
  p.top_k = top_ks[k_choice];
  const float u = static_cast<float>(in.u32() >> 8) * 0x1p-24f;  // [0, 1)
  std::vector<int> history(in.u8() % 20);
  for (int& t : history) t = in.u8() % n;
  std::vector<float> logits(static_cast<size_t>(n));
  // Raw bits for the first values the input holds, then a small-integer pattern (ties).
  for (float& x : logits) {
    if (in.n >= 4) {
      const uint32_t b = in.u32();
      std::memcpy(&x, &b, sizeof x);
    } else {
      x = static_cast<float>(in.u8() % 5);
    }
  }
  validate(p);  // the choices above are all valid

  cpu::SampleScratch s;
  const int id = cpu::sample(logits, p, u, history, s);
  check(id >= 0 && id < n);
  std::vector<float> pen = logits;
  std::vector<int> window;
  cpu::apply_penalties(pen.data(), n, history, p, window);
  const bool all_nan = std::all_of(pen.begin(), pen.end(), [](float v) { return std::isnan(v); });
  check(all_nan || !std::isnan(pen[id]));
  if (p.greedy() || all_nan) return 0;
  std::vector<int> ids;
  std::vector<float> probs;
  cpu::candidates(pen.data(), n, p, ids, probs);
  check(std::find(ids.begin(), ids.end(), id) != ids.end());
  check(ids == reference(pen, p));
  double total = 0.0;
  for (float q : probs) {
    check(q >= 0.0f && q <= 1.0f);
    total += q;
  }
  check(std::fabs(total - 1.0) < 1e-3);
  return 0;
}
