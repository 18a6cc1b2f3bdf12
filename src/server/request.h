// The OpenAI-style request bodies the server accepts, parsed and validated into a GenRequest the
// scheduler runs. Every problem is an ApiError carrying the HTTP status and the OpenAI error
// object's fields ({"error": {"message", "type", "param", "code"}}); unknown fields are ignored.
//
// Defaults follow OpenAI / vLLM: temperature 1, top_p 1, top_k off, min_p 0, no penalties,
// max_tokens = the rest of the context, a random seed.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/sampling.h"
#include "grammar/grammar_cache.h"
#include "runtime/chat_template.h"
#include "runtime/tools.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "",
           std::string code = "invalid_value", std::string type = "invalid_request_error")
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        code(std::move(code)),
        type(std::move(type)) {}
  int status;
  std::string param;  // the offending field; "" = null
  std::string code;
  std::string type;
};

// {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_body(const ApiError& e);

// Most stop strings a request may give, most top logprobs per token (OpenAI's 20), most choices
// (`n`) per request.
inline constexpr int kMaxStops = 16;
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr int kMaxChoices = 16;
// Most `logit_bias` entries per request.
inline constexpr int kMaxLogitBias = 1024;

enum class Endpoint { kCompletions, kChat };

struct GenRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<int> prompt;  // token ids (BOS included as the vocabulary says)
  std::string prompt_text;  // completions: the prompt as text (what echo shows)
  int max_tokens = -1;      // -1 = the rest of the context
  SamplingParams sampling;  // OpenAI defaults (see above); seed -1 = random
  std::vector<std::string> stops;
  int logprobs = -1;  // -1 = none; else the top-N alternatives per token (0..20)
  bool echo = false;  // completions: the prompt is part of the text (and of logprobs)
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Choices sampled from the prompt (OpenAI `n`): the scheduler prefills the prompt once and
  // forks the others from it; choice i draws with seed + i when a seed is given.
  int n = 1;
  // Structured output (response_format, llama.cpp's `grammar`, a required tool call): each
  // sampled token is one the grammar allows; generation stops when it is complete. nullptr: free.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // logit_bias as OpenAI's -100 and 100 act: tokens never sampled, and (when any is given 100) the
  // only tokens that may be. Empty: none. Other values are refused (request.cpp).
  std::vector<int> banned_tokens, only_tokens;
  // Chat with tools rendered into the prompt (tool_choice other than "none"): the reply is parsed
  // into tool calls written in this format.
  std::optional<ToolFormat> tool_calls;
};

// What parsing needs from the served model.
struct ParseContext {
  const Tokenizer* tok = nullptr;
  std::string model_name;  // `model` must equal it (or be absent)
  int seq_ctx = 0;         // positions per sequence
  bool chat = false;       // the model has a chat template of a known format
  ChatFormat format = ChatFormat::kChatML;
  std::string default_system;
  // Special-token text in chat message content (e.g. "<|im_start|>system") becomes control tokens,
  // as llama.cpp and vLLM do; false (--no-special-in-content): it is tokenized as plain text.
  bool special_in_content = true;
  // Compiled grammars (response_format, `grammar`, constrained tool calls), built once per server
  // over the tokenizer and shared by every request, so each schema compiles once.
  std::shared_ptr<grammar::GrammarCache> grammars;
};

// Request bodies keep their keys in the order sent: a schema's properties are generated in that
// order and tools render with their keys as given.
using Body = nlohmann::ordered_json;

// The body as a JSON object; ApiError 400 for malformed JSON or a non-object.
Body parse_json_body(const std::string& body);
// Structured output (response_format, `grammar`) on both; tools, tool_choice, tool turns on chat.
// A bad schema, grammar or tool spec is an ApiError 400 whose param names the field and whose
// message names the construct (the JSON pointer inside a schema, the line and column in GBNF).
GenRequest parse_completion(const Body& body, const ParseContext& ctx);
GenRequest parse_chat(const Body& body, const ParseContext& ctx);
// POST /tokenize {"content": str, "add_special": bool} -> ids; /detokenize {"tokens": [ids]}.
std::vector<int> parse_tokenize(const Body& body, const ParseContext& ctx);
std::vector<int> parse_detokenize(const Body& body, const ParseContext& ctx);

}  // namespace smolrt::server
