#include "runtime/tools.h"

#include <set>

#include "grammar/json_schema.h"

namespace smolrt {

using nlohmann::ordered_json;

namespace {

constexpr size_t kMaxTools = 128;  // OpenAI's limit

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r") - b + 1);
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string dump(const ordered_json& v) {
  return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

void python_json_into(const ordered_json& v, int indent, int level, std::string& out) {
  const bool obj = v.is_object();
  if ((!obj && !v.is_array()) || v.empty()) {
    out += dump(v);
    return;
  }
  out += obj ? '{' : '[';
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += indent > 0 ? "," : ", ";
    first = false;
    if (indent > 0) out += '\n' + std::string(static_cast<size_t>(indent * (level + 1)), ' ');
    if (obj) out += dump(ordered_json(it.key())) + ": ";
    python_json_into(it.value(), indent, level + 1, out);
  }
  if (indent > 0) out += '\n' + std::string(static_cast<size_t>(indent * level), ' ');
  out += obj ? '}' : ']';
}

// A tool call's arguments as the templates render them: the JSON they hold (tojson of the
// parsed object), or the text as a JSON string when it is not JSON.
std::string arguments_json(const std::string& arguments) {
  const ordered_json parsed = ordered_json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return python_json(parsed.is_discarded() ? ordered_json(arguments) : parsed);
}

// --- Hermes (ChatML, Gemma): tools as text inside ordinary turns --------------------------------

std::string hermes_tools_block(std::span<const ToolSpec> tools) {
  std::string s =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ToolSpec& t : tools) {
    s += '\n';
    s += python_json(t.json);
  }
  s +=
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
      "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call>";
  return s;
}

// The conversation with the tool turns folded into plain turns, as Qwen2.5's template writes
// them: render_chat then gives the template's text.
std::vector<ChatMessage> hermes_messages(std::span<const ChatMessage> messages,
                                         std::span<const ToolSpec> tools) {
  std::vector<ChatMessage> out;
  size_t i = 0;
  if (!tools.empty()) {
    std::string sys;
    if (!messages.empty() && messages[0].role == "system") {
      sys = messages[0].content + "\n\n";
      i = 1;
    }
    out.push_back({"system", sys + hermes_tools_block(tools)});
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {  // consecutive results share one user turn
      std::string block;
      for (; i < messages.size() && messages[i].role == "tool"; ++i) {
        if (!block.empty()) block += "\n";
        block += "<tool_response>\n" + messages[i].content + "\n</tool_response>";
      }
      --i;
      out.push_back({"user", block});
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      std::string text = m.content;
      for (const ChatToolCall& c : m.tool_calls) {
        if (!text.empty()) text += "\n";
        text += "<tool_call>\n{\"name\": \"" + c.name +
                "\", \"arguments\": " + arguments_json(c.arguments) + "}\n</tool_call>";
      }
      out.push_back({"assistant", text});
    } else {
      out.push_back({m.role, m.content});
    }
  }
  return out;
}

// --- Llama 3.x ----------------------------------------------------------------------------------

std::string header(const std::string& role) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
}

std::string render_llama3(std::span<const ChatMessage> messages, std::span<const ToolSpec> tools,
                          bool add_generation_prompt,
                          std::vector<std::pair<size_t, size_t>>* content) {
  std::string out;
  const auto put = [&](const std::string& text) {  // a turn's body: the client's text
    if (content) content->emplace_back(out.size(), out.size() + text.size());
    out += text;
  };
  size_t i = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = trimmed(messages[0].content);
    i = 1;
  }
  out = header("system");
  if (!tools.empty()) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
  put(system);
  out += "<|eot_id|>";
  if (!tools.empty()) {  // the tools go in front of the first message after the system one
    std::string first =
        "Given the following functions, please respond with a JSON for a function call with its "
        "proper arguments that best answers the given prompt.\n\nRespond in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do "
        "not use variables.\n\n";
    for (const ToolSpec& t : tools) first += python_json(t.json, 4) + "\n\n";
    if (i < messages.size()) first += trimmed(messages[i++].content);
    out += header("user");
    put(first);
    out += "<|eot_id|>";
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      out += header("ipython");
      put(python_json(ordered_json(m.content)));
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() > 1) {
        throw ToolError("messages", cat("messages[", i,
                                        "]: Llama 3 renders one tool call per assistant "
                                        "message; send each call in its own message"));
      }
      const ChatToolCall& c = m.tool_calls[0];
      out += header("assistant");
      put("{\"name\": \"" + c.name + "\", \"parameters\": " + arguments_json(c.arguments) + "}");
    } else {
      out += header(m.role);
      put(trimmed(m.content));
    }
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += header("assistant");
  return out;
}

}  // namespace

ToolFormat tool_format(ChatFormat f) {
  return f == ChatFormat::kLlama3 ? ToolFormat::kLlama3 : ToolFormat::kHermes;
}

std::string python_json(const ordered_json& v, int indent) {
  std::string out;
  python_json_into(v, indent, 0, out);
  return out;
}

std::vector<ToolSpec> parse_tools(const ordered_json& tools) {
  if (!tools.is_array()) throw ToolError("tools", "'tools' must be an array of tools");
  if (tools.size() > kMaxTools) throw ToolError("tools", cat("at most ", kMaxTools, " tools"));
  std::vector<ToolSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = cat("tools[", i, "]");
    if (!t.is_object() || t.value("type", ordered_json()) != "function")
      throw ToolError(at + ".type",
                      cat(at, " must be {\"type\": \"function\", \"function\": {...}}"));
    if (!t.contains("function") || !t["function"].is_object())
      throw ToolError(at + ".function", cat(at, ".function must be an object"));
    const ordered_json& fn = t["function"];
    ToolSpec spec;
    if (!fn.contains("name") || !fn["name"].is_string() ||
        !valid_name(fn["name"].get<std::string>())) {
      throw ToolError(at + ".function.name",
                      cat(at, ".function.name must be 1 to 64 letters, digits, '_' or '-'"));
    }
    spec.name = fn["name"].get<std::string>();
    if (!names.insert(spec.name).second)
      throw ToolError(at + ".function.name", cat("two tools are named '", spec.name, "'"));
    if (fn.contains("description")) {
      if (!fn["description"].is_string())
        throw ToolError(at + ".function.description",
                        cat(at, ".function.description must be a string"));
      spec.description = fn["description"].get<std::string>();
    }
    if (fn.contains("parameters") && !fn["parameters"].is_null()) {
      const ordered_json& p = fn["parameters"];
      if (!p.is_object() || (p.contains("type") && p["type"] != "object")) {
        throw ToolError(at + ".function.parameters",
                        cat(at, ".function.parameters must be a JSON schema of type object"));
      }
      spec.parameters = p;
      // Arguments are an object: say so where the schema leaves the type open.
      const bool open = !p.contains("type") && !p.contains("$ref") && !p.contains("anyOf") &&
                        !p.contains("allOf") && !p.contains("enum") && !p.contains("const");
      if (open) spec.parameters["type"] = "object";
    }
    spec.json = t;
    out.push_back(std::move(spec));
  }
  return out;
}

ToolChoice parse_tool_choice(const ordered_json* choice, std::span<const ToolSpec> tools) {
  if (!choice || choice->is_null())
    return {tools.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto, ""};
  ToolChoice c;
  if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "none") return {ToolChoiceMode::kNone, ""};
    if (s == "auto")
      c.mode = ToolChoiceMode::kAuto;
    else if (s == "required")
      c.mode = ToolChoiceMode::kRequired;
    else
      throw ToolError("tool_choice",
                      cat("unknown tool_choice '", s, "' (none, auto, required, or a function)"));
  } else if (choice->is_object() && choice->value("type", ordered_json()) == "function" &&
             choice->contains("function") && (*choice)["function"].is_object() &&
             (*choice)["function"].value("name", ordered_json()).is_string()) {
    c.mode = ToolChoiceMode::kFunction;
    c.function = (*choice)["function"]["name"].get<std::string>();
    bool known = false;
    for (const ToolSpec& t : tools) known = known || t.name == c.function;
    if (!known)
      throw ToolError("tool_choice",
                      cat("tool_choice names '", c.function, "', which is not in tools"));
  } else {
    throw ToolError(
        "tool_choice",
        "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}");
  }
  if (tools.empty())
    throw ToolError("tool_choice", "tool_choice other than \"none\" needs 'tools'");
  return c;
}

std::string render_chat_with_tools(ChatFormat f, std::span<const ChatMessage> messages,
                                   std::span<const ToolSpec> tools, bool add_generation_prompt,
                                   std::vector<std::pair<size_t, size_t>>* content) {
  if (f == ChatFormat::kLlama3)
    return render_llama3(messages, tools, add_generation_prompt, content);
  // Every folded turn's text is the client's (tools, calls, results) or wrapper text that holds
  // no control token: all of it is content.
  const std::vector<ChatMessage> plain = hermes_messages(messages, tools);
  return render_chat(f, plain, add_generation_prompt, content);
}

std::optional<grammar::Grammar> tool_call_grammar(ToolFormat f, std::span<const ToolSpec> tools,
                                                  const ToolChoice& choice, bool parallel) {
  using namespace grammar;
  if (choice.mode != ToolChoiceMode::kRequired && choice.mode != ToolChoiceMode::kFunction)
    return std::nullopt;
  Grammar g;
  std::vector<Expr> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolSpec& t = tools[i];
    if (choice.mode == ToolChoiceMode::kFunction && t.name != choice.function) continue;
    JsonSchemaConverter conv(g, cat("fn", i, "-"));
    Expr args;
    try {
      args = t.parameters.is_null() ? seq({lit("{"), conv.ws(), lit("}")})
                                    : conv.convert(t.parameters);
    } catch (const SchemaError& e) {
      throw ToolError(cat("tools[", i, "].function.parameters"),
                      cat("tools[", i, "].function.parameters: ", e.what()));
    }
    const bool hermes = f == ToolFormat::kHermes;
    const std::string head = hermes ? "<tool_call>\n{\"name\": \"" + t.name + "\", \"arguments\": "
                                    : "{\"name\": \"" + t.name + "\", \"parameters\": ";
    calls.push_back(seq({lit(head), std::move(args), lit(hermes ? "}\n</tool_call>" : "}")}));
  }
  if (calls.empty()) throw ToolError("tool_choice", "tool_choice names no tool in tools");
  const int call = g.add_rule("tool-call", alt(std::move(calls)));
  const bool several =
      choice.mode == ToolChoiceMode::kRequired && parallel && f == ToolFormat::kHermes;
  g.root =
      g.add_rule("root", several ? seq({ref(call), star(seq({lit("\n"), ref(call)}))}) : ref(call));
  return g;
}

std::string tool_grammar_key(ToolFormat f, std::span<const ToolSpec> tools,
                             const ToolChoice& choice, bool parallel) {
  std::string key = cat("tools:", static_cast<int>(f), ":", static_cast<int>(choice.mode), ":",
                        choice.function, ":", parallel);
  for (const ToolSpec& t : tools) key += "\x1e" + t.name + "\x1f" + dump(t.parameters);
  return key;
}

}  // namespace smolrt
