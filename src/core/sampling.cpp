#include "core/sampling.h"

#include <cmath>

#include "core/error.h"

namespace smolrt {

void validate(const SamplingParams& p) {
  auto finite = [](float v, const char* flag) {
    if (!std::isfinite(v)) fail(flag, " must be a finite number, got ", v);
  };
  finite(p.temp, "--temp");
  finite(p.top_p, "--top-p");
  finite(p.min_p, "--min-p");
  finite(p.repeat_penalty, "--repeat-penalty");
  finite(p.presence_penalty, "--presence-penalty");
  finite(p.frequency_penalty, "--frequency-penalty");
  if (p.temp < 0.0f) fail("--temp ", p.temp, " is negative; use 0 for greedy or a value > 0");
  if (p.top_k < 0) fail("--top-k ", p.top_k, " is negative; use 0 to disable top-k or a k > 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    fail("--top-p ", p.top_p, " is outside (0, 1]; use 1 to disable top-p");
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    fail("--min-p ", p.min_p, " is outside [0, 1]; use 0 to disable min-p");
  }
  if (!(p.repeat_penalty > 0.0f)) {
    fail("--repeat-penalty ", p.repeat_penalty, " must be > 0; use 1 to disable it");
  }
  if (p.repeat_last_n < -1) {
    fail("--repeat-last-n ", p.repeat_last_n,
         " is invalid; use 0 (off), -1 (the whole context) or a count > 0");
  }
  if (p.seed < -1) fail("--seed ", p.seed, " is invalid; use -1 (random) or a value >= 0");
}

}  // namespace smolrt
