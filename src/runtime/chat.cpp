#include "runtime/chat.h"

#include <chrono>

#include "core/error.h"

namespace smolrt {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

ChatSession::ChatSession(Backend& backend, const Tokenizer& tok, ChatOptions opt)
    : be_(backend), tok_(tok), opt_(std::move(opt)), sampler_(opt_.sampling) {
  if (opt_.max_tokens < -1) {
    fail("--n-predict ", opt_.max_tokens, " is invalid; use -1 (until the reply ends) or >= 0");
  }
  const char* end = chat_end_marker(opt_.format);
  end_ids_ = tok_.encode(end, /*parse_special=*/true, /*add_bos=*/0);
  opt_.stops.emplace_back(end);  // the marker as plain text, for vocabularies without it
  reset();
}

void ChatSession::reset() {
  messages_.clear();
  if (!opt_.system.empty()) messages_.push_back({"system", opt_.system});
  tokens_.clear();
  sampler_.clear_history();
  be_.reset();
}

std::vector<int> ChatSession::encode(const std::string& text, bool first) const {
  return tok_.encode(text, /*parse_special=*/true, first ? -1 : 0);
}

int ChatSession::drop_oldest_until_fits(std::string_view user) {
  const size_t n_sys = (!messages_.empty() && messages_[0].role == "system") ? 1 : 0;
  int dropped = 0;
  for (;;) {
    std::vector<ChatMessage> kept(messages_.begin(), messages_.end());
    kept.push_back({"user", std::string(user)});
    std::vector<int> all = encode(render_chat(opt_.format, kept, true), true);
    if (static_cast<int>(all.size()) + 1 <= be_.n_ctx()) {
      tokens_ = std::move(all);
      be_.reset();
      sampler_.clear_history();
      return dropped;
    }
    if (messages_.size() <= n_sys) {
      fail("this message needs ", all.size(),
           " tokens with the system prompt and the template, "
           "more than the context of ",
           be_.n_ctx(), " tokens; shorten it or use a larger --ctx");
    }
    // Drop the oldest exchange: the first user message and the reply after it.
    auto first = messages_.begin() + static_cast<std::ptrdiff_t>(n_sys);
    auto last = first + 1;
    if (last != messages_.end() && last->role == "assistant") ++last;
    messages_.erase(first, last);
    ++dropped;
  }
}

int ChatSession::pick_first(std::span<const int> prefill) {
  return be_.forward_prompt_sample(prefill, opt_.sampling, sampler_.step_draw(),
                                   sampler_.history());
}

int ChatSession::pick_next(int token) {
  const int pos = be_.position();
  if (opt_.sampling.greedy() && !opt_.sampling.has_penalties()) {
    return be_.forward_token_greedy(token, pos);  // argmax on the device
  }
  return be_.forward_token_sample(token, pos, opt_.sampling, sampler_.step_draw(),
                                  sampler_.history());
}

TurnResult ChatSession::turn(std::string_view user,
                             const std::function<void(std::string_view)>& on_text) {
  TurnResult r;
  const auto t0 = std::chrono::steady_clock::now();

  // The new text: system (first turn), user message, assistant header. After a previous reply,
  // tokens_ ends with its end marker, so what the format puts after it comes first ("\n").
  const bool first = tokens_.empty();
  std::vector<ChatMessage> add_msgs;
  if (first && !messages_.empty()) add_msgs.push_back(messages_[0]);  // the system prompt
  add_msgs.push_back({"user", std::string(user)});
  std::string delta = first ? std::string() : std::string(chat_turn_gap(opt_.format));
  delta += render_chat(opt_.format, add_msgs, true);
  std::vector<int> add = encode(delta, first);

  if (static_cast<int>(tokens_.size() + add.size()) + 1 > be_.n_ctx()) {
    if (opt_.policy == ContextPolicy::kStop) {
      fail("the conversation would need ", tokens_.size() + add.size(),
           " tokens, more than the "
           "context of ",
           be_.n_ctx(), "; type /reset to start over (or use a larger --ctx)");
    }
    r.n_dropped = drop_oldest_until_fits(user);
  } else {
    tokens_.insert(tokens_.end(), add.begin(), add.end());
  }

  // The KV cache holds tokens_[0, position()); prefill the rest.
  if (be_.position() > static_cast<int>(tokens_.size())) be_.reset();
  const std::span<const int> prefill =
      std::span<const int>(tokens_).subspan(static_cast<size_t>(be_.position()));
  r.n_prefilled = static_cast<int>(prefill.size());
  sampler_.accept(prefill);
  int t = pick_first(prefill);
  r.prefill_s = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  StreamDecoder dec(tok_);
  StopMatcher stop(opt_.stops);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    if (on_text) on_text(s);
  };
  const bool single_end = end_ids_.size() == 1;
  for (;;) {
    if (tok_.is_eog(t) || (single_end && t == end_ids_[0])) {
      r.stop = StopCause::kEog;
      break;
    }
    if (opt_.max_tokens >= 0 && static_cast<int>(r.tokens.size()) >= opt_.max_tokens) {
      r.stop = StopCause::kMaxTokens;
      break;
    }
    r.tokens.push_back(t);
    sampler_.accept(t);
    emit(stop.push(dec.push(t)));
    if (stop.stopped()) {
      r.stop = StopCause::kStopString;
      break;
    }
    if (opt_.max_tokens >= 0 && static_cast<int>(r.tokens.size()) >= opt_.max_tokens) {
      r.stop = StopCause::kMaxTokens;  // checked before the forward: no wasted step
      break;
    }
    if (be_.position() >= be_.n_ctx()) {  // no room to run `t` through the model
      r.stop = StopCause::kContextFull;
      break;
    }
    t = pick_next(t);
  }
  if (!stop.stopped()) {
    emit(stop.push(dec.flush()));
    if (!stop.stopped()) emit(stop.flush());
  }
  r.decode_s = seconds_since(t1);

  // The reply enters the conversation as generated (its last token never ran through the model,
  // so the KV cache ends one short of it), closed by the end marker whatever stopped it.
  tokens_.insert(tokens_.end(), r.tokens.begin(), r.tokens.end());
  tokens_.insert(tokens_.end(), end_ids_.begin(), end_ids_.end());
  messages_.push_back({"user", std::string(user)});
  messages_.push_back({"assistant", r.text});
  return r;
}

}  // namespace smolrt
