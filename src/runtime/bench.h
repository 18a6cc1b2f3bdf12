// The benchmark behind `smolrt bench`: prefill and decode speed of a Backend, per prompt length.
// Validation is the tests' job; this only times. Every figure is a median over iterations after
// three untimed ones, with min and max beside it.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"

namespace smolrt {

struct BenchConfig {
  std::vector<int> prompt_lengths = {32, 128, 512};
  int gen_length = 128;
  int iterations = 5;
};

struct Stat {
  double median = 0, min = 0, max = 0;
};
Stat stat_of(std::vector<double> xs);  // empty -> zeros

struct BenchRow {
  int prompt_length = 0;
  int gen_length = 0;
  Stat prefill_tok_s;  // prompt tokens / prefill seconds
  Stat decode_tok_s;   // generated tokens / decode seconds (first token excluded: it comes from
                       // the prefill logits)
  Stat ttft_ms;        // prefill + argmax of the last logits
  Stat decode_us_per_token;
  double decode_weight_gb_s = 0;  // weight bytes per token / median decode time per token
};

// Bytes of weights a decode step reads: every layer tensor, the final norm, the output matrix
// (token_embd when tied) and one embedding row.
size_t decode_weight_bytes(const Model& m);

// The current UTC time as ISO 8601 (2026-11-25T09:04:14Z): the "date" of every benchmark JSON line.
std::string utc_now();

// Deterministic prompt of n token ids in [0, vocab) (a fixed LCG; ids never special-cased).
std::vector<int> bench_prompt(int n, int vocab);

// Runs the benchmark; throws Error when prompt + gen exceeds the backend's context.
std::vector<BenchRow> run_bench(Backend& b, const Model& m, const BenchConfig& cfg);

}  // namespace smolrt
