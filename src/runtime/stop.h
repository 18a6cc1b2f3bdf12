// Stop strings for streamed text. Text arrives in pieces (one decoded token at a time) and a stop
// string may straddle pieces, so the matcher holds back any tail that could still become a stop
// string: text it releases never contains (a prefix of) a stop string that later completes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace smolrt {

// Why generation ended.
enum class StopCause {
  kNone,         // still running
  kEog,          // an end-of-generation token (EOS / EOT / <|im_end|>)
  kStopString,   // one of the --stop strings appeared in the output
  kMaxTokens,    // the token limit was reached
  kContextFull,  // the KV cache is full
};
const char* stop_cause_name(StopCause c);  // "none" | "eog" | "stop" | "length" | "context"

class StopMatcher {
 public:
  // Empty strings are ignored (an empty stop string would match before any output).
  explicit StopMatcher(std::vector<std::string> stops = {});

  // Adds text; returns the text that is now safe to show. After a match, returns the text before
  // the stop string, sets stopped(), and ignores further input.
  std::string push(std::string_view text);
  // End of output without a match: returns the held-back tail (empty after a match).
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that matched
  void reset();

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet released: a suffix that is a prefix of some stop string
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace smolrt
