// One generation request's response in OpenAI's shapes, built from the Deltas its Job hands over:
// server-sent events (`data: {...}\n\n` chunks, then `data: [DONE]`) when streaming, one JSON
// object otherwise. Transport-free: the HTTP layer decides how the bytes travel.
//
// A request the server cancelled before it produced anything (shutdown while it waited in the
// queue) is answered 503 (an error event when streaming: the stream's 200 went out when it was
// queued) instead of an empty 200. Cancelled requests that did produce something end with
// finish_reason "stop" (the value OpenAI clients accept that asks for no continuation) and
// "stop_reason": "cancelled" | "shutdown"; otherwise stop_reason is null.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/scheduler.h"

namespace smolrt::server {

// What to send after a Delta.
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

class GenResponse {
 public:
  GenResponse(std::shared_ptr<Job> job, Endpoint ep, std::string id, long long created,
              std::string model, const Tokenizer& tok);
  ~GenResponse();  // cancels the job (a no-op once it finished): a dropped response frees its
                   // sequence
  GenResponse(const GenResponse&) = delete;
  GenResponse& operator=(const GenResponse&) = delete;

  Job& job() { return *job_; }
  bool stream() const { return job_->request().stream; }
  // Folds in d. `started`: a stream's 200 header was sent (no other status is possible).
  GenStep step(const Delta& d, bool started);
  // "prompt=12 gen=34 finish=stop" once done, for the request's log line.
  const std::string& note() const { return note_; }

 private:
  nlohmann::json head(const char* object) const;
  nlohmann::json logprobs_of(const std::vector<TokenLogprob>& prompt,
                             const std::vector<TokenLogprob>& gen, bool keep);
  nlohmann::json chunk(const std::string& text, nlohmann::json logprobs, nlohmann::json finish);
  std::string stream_chunks(const Delta& d);
  std::string stream_end(const Delta& d);
  void accumulate(const Delta& d);
  nlohmann::json whole(const Delta& d);

  std::shared_ptr<Job> job_;
  Endpoint ep_;
  std::string id_;
  long long created_;
  std::string model_;
  const Tokenizer& tok_;
  bool first_ = true;  // no chunk made yet
  size_t offset_ = 0;  // completions: bytes of text so far (logprobs text_offset)
  Delta all_;          // non-streaming: everything so far
  CompletionLogprobs lp_;
  nlohmann::json chat_lp_ = nlohmann::json::array();
  std::string note_;
};

// The whole text of an OpenAI error response.
std::string error_json(const ApiError& e);

}  // namespace smolrt::server
