// A model's reply -> content + tool calls, for the formats of runtime/tools.h, in one pass that
// also streams: ToolCallParser takes the text as it arrives and yields OpenAI-style deltas (the
// content so far; per call its index, then id and function name once the name is complete, then
// the arguments text in fragments as they arrive). parse_tool_reply runs it over a whole reply
// and keeps the calls only when every one is well-formed (a name and an arguments JSON object)
// and no call was begun and abandoned; otherwise the whole reply is plain content. No input
// makes either throw.
//
// Hermes: content, then <tool_call>{...}</tool_call> blocks (the closing tag may be missing at
// the end); whitespace right before a block is dropped from the content. Llama 3: a reply whose
// first non-blank character is '{' is a call {"name": ..., "parameters" (or "arguments"): ...};
// several may follow separated by ';'. A call's JSON may give its keys in any order; other keys
// are ignored. The arguments are the value's text as written (OpenAI's arguments string).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/chat_template.h"
#include "runtime/tools.h"

namespace smolrt {

struct ToolCallDelta {
  int index = 0;          // which call (0, 1, ...)
  std::string id;         // "call_..." with the name, in the call's first delta only
  std::string name;       // in the call's first delta only
  std::string arguments;  // a fragment of the arguments text (may be empty)
};

struct ReplyDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

struct ParsedReply {
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // empty: a plain reply
};

class ToolCallParser {
 public:
  // id_seed: the call ids' random stream ("call_" + 24 letters and digits).
  ToolCallParser(ToolFormat format, uint64_t id_seed);
  ReplyDelta push(std::string_view text);
  // Everything still held back (a partial tag, trailing blanks, an unfinished call's text).
  ReplyDelta finish();
  int n_calls() const { return static_cast<int>(calls_.size()); }
  // Every call so far is complete and well-formed, and no call was begun and abandoned.
  bool calls_ok() const;

 private:
  enum class Mode { kStart, kText, kBody, kAfterBody };
  // The call's JSON object, scanned a character at a time.
  enum class Scan { kOpen, kKey, kInKey, kColon, kValue, kInValue, kNext, kDone };
  struct Call {
    std::string id, name, args;
    bool named = false, complete = false;
  };

  ToolFormat format_;
  uint64_t rng_;
  Mode mode_;
  std::string held_;  // text not yet emitted (kText: a possible tag start or blanks)
  std::string raw_;   // the current call's text since its start (content if it fails)
  std::vector<Call> calls_;
  ReplyDelta out_;
  // The scanner of the current call's JSON.
  Scan scan_ = Scan::kOpen;
  std::string key_, value_, pending_args_;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false, string_value_ = false;
  bool abandoned_ = false;  // a call started but turned out malformed or unfinished

  void text_char(char c);
  void body_char(char c);
  void after_char(char c);
  void emit_content(std::string_view s);
  void start_call();
  void fail_call();
  void end_value();
  void emit_args(std::string_view s);
  std::string new_id();
};

ParsedReply parse_tool_reply(ToolFormat format, std::string_view text, uint64_t id_seed);

}  // namespace smolrt
