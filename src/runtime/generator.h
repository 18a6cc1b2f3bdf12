// Generator: prefill a prompt, then decode token by token until an end-of-generation token,
// the token limit or a full context; streams the text through StreamDecoder and times both
// phases. Backend-agnostic: the same loop drives the CPU oracle and the CUDA backend.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "runtime/sampler.h"
#include "runtime/stop.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {

// Picks the next token from the logits of the last position (vocab_size floats). An empty
// Sampler means greedy: the backend's forward_token_greedy (argmax on the GPU for CUDA).
using Sampler = std::function<int(std::span<const float> logits)>;

struct GenerateOptions {
  int max_tokens = 64;      // generated tokens at most (the end-of-generation token included)
  bool stop_at_eog = true;  // stop at the tokenizer's end-of-generation ids (is_eog)
  Sampler sampler;          // empty = greedy
  // When set (and `sampler` is empty): sample through the Backend seam with its parameters,
  // draws and penalty history (on the GPU for CUDA: no logit readback). The generator feeds it
  // the prompt and every generated token. Not owned.
  TokenSampler* token_sampler = nullptr;
  // Stop strings: the text stops before the first match, across token boundaries.
  std::vector<std::string> stops;
};

enum class StopReason { kEog, kMaxTokens, kContextFull, kStopString };
const char* stop_reason_name(StopReason r);  // "eog" | "length" | "context" | "stop"

struct GenerateResult {
  std::vector<int> prompt_ids;     // what was prefilled
  std::vector<int> generated_ids;  // every generated id, the end-of-generation id included
  std::string text;                // decoded generated text (eog tokens not rendered)
  StopReason stop = StopReason::kMaxTokens;
  double prefill_s = 0;    // wall time of forward_prompt + picking the first token
  double decode_s = 0;     // wall time of the decode steps (one forward each)
  int n_decode_steps = 0;  // forward calls after the prefill (generated_ids.size() - 1 or less)

  double prefill_tok_s() const { return prefill_s > 0 ? prompt_ids.size() / prefill_s : 0; }
  double decode_tok_s() const { return decode_s > 0 ? n_decode_steps / decode_s : 0; }
};

class Generator {
 public:
  Generator(Backend& backend, const Tokenizer& tok) : be_(backend), tok_(tok) {}

  // Tokenizes `prompt` (special tokens parsed, BOS as the vocab says). Empty-prompt policy: the
  // prompt becomes [BOS] when the vocab has a BOS token, else Error.
  std::vector<int> tokenize_prompt(std::string_view prompt) const;

  // Resets the backend, prefills `prompt_ids` from position 0 and decodes. on_text receives each
  // piece of text as soon as it is complete UTF-8 (may be empty: not called then).
  // Errors: empty prompt, prompt longer than the context, max_tokens < 0.
  GenerateResult generate(std::span<const int> prompt_ids, const GenerateOptions& opt,
                          const std::function<void(std::string_view)>& on_text = {});

 private:
  Backend& be_;
  const Tokenizer& tok_;
};

}  // namespace smolrt
