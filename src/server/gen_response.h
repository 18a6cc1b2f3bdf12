// One generation request's response in OpenAI's shapes, built from the Deltas of its choices' Jobs
// (one per choice, Scheduler::submit_n): server-sent events (`data: {...}\n\n` chunks, then
// `data: [DONE]`) when streaming, one JSON object otherwise. Transport-free: the HTTP layer
// decides how the bytes travel.
//
// Choices: choice i is jobs[i]; streamed chunks carry their choice's `index` and each choice ends
// with its own finish chunk; with stream_options.include_usage one usage chunk follows the last.
// Usage counts as OpenAI does: the prompt once, the completion tokens of every choice, and
// prompt_tokens_details.cached_tokens (prompt tokens the prefix cache gave the first choice).
//
// Tool calls (chat with tools rendered): each choice's reply goes through the tool-call parser;
// streamed, calls arrive as `delta.tool_calls` ({index, id, type, function {name, arguments}},
// then argument fragments); whole, as `message.tool_calls` with content null when the reply is
// only calls. A choice that made calls and ended normally has finish_reason "tool_calls".
//
// A request the server cancelled before any choice produced anything (shutdown while it waited in
// the queue) is answered 503 (an error event when streaming: the stream's 200 went out when it
// was queued) instead of an empty 200. Cancelled requests that did produce something end with
// finish_reason "stop" (the value OpenAI clients accept that asks for no continuation) and
// "stop_reason": "cancelled" | "shutdown"; otherwise stop_reason is null. A choice that fails
// ends the whole response with a 500 (an error event when streaming).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tool_parser.h"
#include "server/request.h"
#include "server/scheduler.h"

namespace smolrt::server {

// What to send after polling the choices.
struct GenStep {
  // Streaming: SSE events to write now (may be empty). Otherwise, once done: the JSON body.
  std::string data;
  bool done = false;  // the response is complete
  // Non-streaming, once done: the response's status (200, or 503 / 500 with an error body).
  int status = 200;
};

// Completions' logprobs: parallel arrays; text_offset counts bytes of the response text.
struct CompletionLogprobs {
  nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                 top_logprobs = nlohmann::json::array(), text_offset = nlohmann::json::array();
  void add(const Tokenizer& tok, const TokenLogprob& lp, size_t& offset);
  nlohmann::json to_json() const;
};

// OpenAI's tool-call objects: a whole call (message.tool_calls[i]) and a streamed delta
// (delta.tool_calls[i]: id, type and name in a call's first delta, then argument fragments).
nlohmann::json tool_call_json(const ChatToolCall& c);
nlohmann::json tool_call_delta_json(const ToolCallDelta& d);

class GenResponse {
 public:
  // jobs: the request's choices in order (at least one).
  GenResponse(std::vector<std::shared_ptr<Job>> jobs, Endpoint ep, std::string id,
              long long created, std::string model, const Tokenizer& tok);
  ~GenResponse();  // cancels the jobs (a no-op once finished): a dropped response frees them
  GenResponse(const GenResponse&) = delete;
  GenResponse& operator=(const GenResponse&) = delete;

  bool stream() const { return req().stream; }
  // Takes what the choices have published (without blocking) and folds it in. `started`: a
  // stream's 200 header was sent (no other status is possible).
  GenStep poll(bool started);
  // "prompt=12 cached=0 gen=34 finish=stop" once done, for the request's log line.
  const std::string& note() const { return note_; }

 private:
  struct Choice {
    std::shared_ptr<Job> job;
    int index = 0;
    bool first = true;      // streaming: no chunk sent yet
    bool finished = false;  // its final Delta came
    size_t offset = 0;      // completions: bytes of text so far (logprobs text_offset)
    Delta all;              // the text (non-streaming) and the standing so far
    std::vector<TokenLogprob> prompt_lp, gen_lp;  // non-streaming
    std::optional<ToolCallParser> parser;         // streaming with tools
    int n_calls = 0;                              // streaming: tool calls sent
  };

  const GenRequest& req() const { return choices_.front().job->request(); }
  uint64_t call_seed(int choice) const { return id_seed_ + 0x9E3779B97F4A7C15ull * choice; }
  nlohmann::json head(const char* object) const;
  nlohmann::json usage() const;
  std::string finish_reason(const Choice& c, bool calls) const;
  nlohmann::json completion_logprobs(Choice& c, const std::vector<TokenLogprob>& prompt,
                                     const std::vector<TokenLogprob>& gen);
  nlohmann::json chat_logprobs(const std::vector<TokenLogprob>& gen) const;
  nlohmann::json chunk(Choice& c, const std::string& text, const nlohmann::json& calls,
                       nlohmann::json logprobs, nlohmann::json finish);
  std::string stream_delta(Choice& c, const Delta& d);
  std::string stream_finish(Choice& c);
  nlohmann::json whole();
  GenStep end_with_error(const ApiError& e, bool started);

  std::vector<Choice> choices_;
  Endpoint ep_;
  std::string id_;
  long long created_;
  std::string model_;
  const Tokenizer& tok_;
  // echo + logprobs: the prompt's logprobs, scored by the first choice, shown in every choice.
  std::vector<TokenLogprob> prompt_lp_;
  uint64_t id_seed_ = 0;  // the tool-call ids' random stream
  std::string note_;
};

// The whole text of an OpenAI error response.
std::string error_json(const ApiError& e);

}  // namespace smolrt::server
