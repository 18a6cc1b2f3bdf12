// Multi-turn chat over one Backend: a session that keeps the KV cache
// between turns so each turn prefills only its own new tokens.
//
// Token bookkeeping: tokens() is the whole conversation as the model should see it; the backend's
// KV cache always holds a prefix of it (positions [0, backend.position())). A turn appends the
// end of the previous reply + the new user message + the assistant header, prefills everything
// past the cached prefix, then decodes the reply.
//
// Context policy when the next turn does not fit (ContextPolicy):
//   kDropOldest (default): drop the oldest user/assistant exchanges (the system prompt stays),
//                          re-render the kept conversation and re-prefill it from position 0;
//   kStop:                 refuse the turn with an Error telling the user to /reset.
// A reply that fills the context during decoding is cut there (StopCause::kContextFull).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "runtime/chat_template.h"
#include "runtime/sampler.h"
#include "runtime/stop.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {

enum class ContextPolicy { kDropOldest, kStop };

struct ChatOptions {
  SamplingParams sampling;         // temp 0 = greedy
  std::vector<std::string> stops;  // extra stop strings (the reply end token always stops)
  int max_tokens = -1;             // per reply; -1 = until end of turn or a full context
  std::string system;              // system prompt; "" = none (no system message rendered)
  ContextPolicy policy = ContextPolicy::kDropOldest;
  ChatFormat format = ChatFormat::kChatML;  // resolve_chat_format's choice
};

struct TurnResult {
  std::string text;         // the reply as shown (stop string and end token excluded)
  std::vector<int> tokens;  // reply tokens that entered the conversation
  StopCause stop = StopCause::kNone;
  int n_prefilled = 0;  // tokens prefilled for this turn
  int n_dropped = 0;    // exchanges dropped by kDropOldest before this turn
  double prefill_s = 0, decode_s = 0;
};

class ChatSession {
 public:
  // Throws Error when the sampling parameters are invalid.
  ChatSession(Backend& backend, const Tokenizer& tok, ChatOptions opt);

  // One exchange: appends the user message, streams the reply text through on_text (may be
  // called with pieces as small as one character; never with text past a stop string).
  TurnResult turn(std::string_view user, const std::function<void(std::string_view)>& on_text = {});

  // Forgets the conversation (keeps the system prompt) and empties the KV cache.
  void reset();

  const std::vector<int>& tokens() const { return tokens_; }
  const std::vector<ChatMessage>& messages() const { return messages_; }
  uint64_t seed() const { return sampler_.seed(); }

 private:
  std::vector<int> encode(const std::string& text, bool first) const;
  // Makes tokens_ = the re-rendered kept conversation + `user`, dropping exchanges as needed.
  int drop_oldest_until_fits(std::string_view user);
  int pick_first(std::span<const int> prefill);
  int pick_next(int token);

  Backend& be_;
  const Tokenizer& tok_;
  ChatOptions opt_;
  TokenSampler sampler_;
  std::vector<ChatMessage> messages_;
  std::vector<int> tokens_;
  std::vector<int> end_ids_;  // the format's end marker as tokens (one control token)
};

}  // namespace smolrt
