// OpenAI tool calling as pure functions: validating `tools` / `tool_choice`, rendering the tools
// and the tool turns of a conversation the way each chat family's template does, and the grammar
// that constrains a reply to tool calls (tool_choice "required" or a named function). Parsing a
// reply into tool calls is runtime/tool_parser.h.
//
// Formats (docs/grammar.md has the exact text):
//   - ChatML (Qwen2.5 and every other ChatML model, SmolLM2 included) and Gemma: Hermes style,
//     Qwen2.5's template. The system turn gets a "# Tools" section listing each tool as one JSON
//     line inside <tools></tools>; the model answers
//       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//     (several blocks, one per line, for parallel calls); assistant tool calls render back the
//     same way, tool results as <tool_response>\n...\n</tool_response> blocks in a user turn.
//   - Llama 3.x: Meta's llama3.1/3.2 JSON tool calling, tools in the first user message
//     (tools_in_user_message, the template's default) as indented JSON, "Environment: ipython"
//     and the knowledge/date lines ("26 Jul 2024", the template's default date) in the system
//     turn; the model answers {"name": "f", "parameters": {...}} (one call); tool results are
//     ipython turns holding the result as a JSON string, as the template renders them.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"
#include "runtime/chat_template.h"

namespace smolrt {

enum class ToolFormat { kHermes, kLlama3 };
ToolFormat tool_format(ChatFormat f);

struct ToolSpec {
  std::string name;                   // [A-Za-z0-9_-]{1,64}
  std::string description;            // "" when absent
  nlohmann::ordered_json parameters;  // the arguments' JSON schema (null when absent: none)
  nlohmann::ordered_json json;        // the tool object as the request gave it (rendered as is)
};

// A bad `tools` / `tool_choice` / tool message; `param` names the field ("tools[1].function.name").
class ToolError : public Error {
 public:
  ToolError(std::string param, const std::string& message)
      : Error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// OpenAI `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}]. Parse the request body with nlohmann::ordered_json so the tools render with
// their keys in the order sent. Throws ToolError.
std::vector<ToolSpec> parse_tools(const nlohmann::ordered_json& tools);

enum class ToolChoiceMode { kNone, kAuto, kRequired, kFunction };
struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function;  // kFunction: its name
};
// OpenAI `tool_choice` ("none" | "auto" | "required" | {"type": "function", "function":
// {"name"}}); nullptr/null = "auto" with tools, "none" without. Throws ToolError (a named
// function that is not in tools, choices other than "none" without tools).
ToolChoice parse_tool_choice(const nlohmann::ordered_json* choice, std::span<const ToolSpec> tools);

// The conversation in format f with these tools (pass none for tool_choice "none"); assistant
// tool calls and role "tool" messages render as the family does whether or not tools are given.
// Without tools and tool turns, ChatML and Gemma give exactly render_chat's text. Throws
// ToolError for what a family cannot render (Llama 3: more than one call in one message).
// content: as render_chat's, the byte ranges of the turns' bodies (the client's text: messages,
// tools, calls, results), for tokenizing them as plain text.
std::string render_chat_with_tools(ChatFormat f, std::span<const ChatMessage> messages,
                                   std::span<const ToolSpec> tools, bool add_generation_prompt,
                                   std::vector<std::pair<size_t, size_t>>* content = nullptr);

// The grammar of a reply for tool_choice "required" (one or more calls of any tool, one per
// line, or exactly one when !parallel or Llama 3) or a named function (one call of it): the
// format's wrapper text exactly as rendered above with the arguments constrained by each tool's
// parameters schema. nullopt for "auto" and "none" (unconstrained). Throws ToolError
// ("tools[i].function.parameters") when a schema is not supported.
std::optional<grammar::Grammar> tool_call_grammar(ToolFormat f, std::span<const ToolSpec> tools,
                                                  const ToolChoice& choice, bool parallel);
// A GrammarCache key for tool_call_grammar's result with these inputs.
std::string tool_grammar_key(ToolFormat f, std::span<const ToolSpec> tools,
                             const ToolChoice& choice, bool parallel);

// JSON as Python's json.dumps writes it (what the templates' tojson filter gives): ", " and ": "
// separators, or with indent > 0 one item per line; non-ASCII as is.
std::string python_json(const nlohmann::ordered_json& v, int indent = 0);

}  // namespace smolrt
