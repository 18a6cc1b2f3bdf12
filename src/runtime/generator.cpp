#include "runtime/generator.h"

#include <chrono>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace smolrt {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEog:
      return "eog";
    case StopReason::kMaxTokens:
      return "length";
    case StopReason::kContextFull:
      return "context";
    case StopReason::kStopString:
      return "stop";
  }
  return "unknown";
}

std::vector<int> Generator::tokenize_prompt(std::string_view prompt) const {
  std::vector<int> ids = tok_.encode(prompt, /*parse_special=*/true, /*add_bos=*/-1);
  if (ids.empty()) {
    const int bos = tok_.vocab().bos;
    if (bos < 0) {
      fail(
          "the prompt is empty and this model's vocabulary has no BOS token to start from; "
          "pass a non-empty prompt with -p");
    }
    ids.push_back(bos);
  }
  return ids;
}

GenerateResult Generator::generate(std::span<const int> prompt_ids, const GenerateOptions& opt,
                                   const std::function<void(std::string_view)>& on_text) {
  if (prompt_ids.empty()) fail("cannot generate from an empty prompt (no token ids)");
  if (opt.max_tokens < 0) {
    fail("the number of tokens to generate (-n) is ", opt.max_tokens, "; it must be >= 0");
  }
  if (static_cast<int64_t>(prompt_ids.size()) > be_.n_ctx()) {
    fail("the prompt has ", prompt_ids.size(), " tokens but the context holds only ", be_.n_ctx(),
         "; use a larger --ctx (up to ", be_.config().n_ctx_train, ") or a shorter prompt");
  }
  GenerateResult res;
  res.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  StreamDecoder dec(tok_);
  StopMatcher stop(opt.stops);
  auto emit = [&](const std::string& piece) {
    const std::string s = stop.push(piece);  // holds back a possible partial stop string
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };
  TokenSampler* ts = opt.sampler ? nullptr : opt.token_sampler;
  if (ts) ts->accept(prompt_ids);

  be_.reset();
  if (opt.max_tokens == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    be_.forward_prompt(prompt_ids);
    res.prefill_s = seconds_since(t0);
    return res;
  }

  // Prefill; the first token comes from the last prompt position's logits.
  auto t0 = std::chrono::steady_clock::now();
  int next;
  if (ts) {
    next = be_.forward_prompt_sample(prompt_ids, ts->params(), ts->step_draw(), ts->history());
  } else {
    std::span<const float> logits = be_.forward_prompt(prompt_ids);
    next = opt.sampler ? opt.sampler(logits)
                       : cpu::argmax(logits.data(), static_cast<int>(logits.size()));
  }
  res.prefill_s = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  for (;;) {
    res.generated_ids.push_back(next);
    if (opt.stop_at_eog && tok_.is_eog(next)) {
      res.stop = StopReason::kEog;
      break;
    }
    if (ts) ts->accept(next);
    emit(dec.push(next));
    if (stop.stopped()) {
      res.stop = StopReason::kStopString;
      break;
    }
    if (static_cast<int>(res.generated_ids.size()) >= opt.max_tokens) {
      res.stop = StopReason::kMaxTokens;
      break;
    }
    const int pos = be_.position();
    if (pos >= be_.n_ctx()) {
      res.stop = StopReason::kContextFull;
      break;
    }
    if (ts) {
      next = be_.forward_token_sample(next, pos, ts->params(), ts->step_draw(), ts->history());
    } else if (opt.sampler) {
      next = opt.sampler(be_.forward_token(next, pos));
    } else {
      next = be_.forward_token_greedy(next, pos);
    }
    ++res.n_decode_steps;
  }
  res.decode_s = seconds_since(t0);
  if (!stop.stopped()) {
    emit(dec.flush());
    if (!stop.stopped()) {
      const std::string tail = stop.flush();  // no match at the end: the held-back text
      res.text += tail;
      if (on_text && !tail.empty()) on_text(tail);
    }
  }
  return res;
}

}  // namespace smolrt
