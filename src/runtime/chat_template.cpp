#include "runtime/chat_template.h"

#include <string_view>

#include "core/error.h"

namespace smolrt {

namespace {
constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
}  // namespace

ChatFormat resolve_chat_format(const std::string& option, const std::string& model_template) {
  if (option == "chatml") return ChatFormat::kChatML;
  if (option == "gemma") return ChatFormat::kGemma;
  if (option == "llama3") return ChatFormat::kLlama3;
  if (option != "" && option != "auto") {
    fail("unknown --chat-template '", option,
         "'; supported values: chatml, gemma, llama3, auto (the default: "
         "the format of the model's tokenizer.chat_template)");
  }
  if (model_template.empty()) {
    fail(
        "the model has no tokenizer.chat_template; pass --chat-template chatml, gemma or llama3 "
        "to pick a format");
  }
  if (model_template.find(kImStart) != std::string::npos &&
      model_template.find(kImEnd) != std::string::npos) {
    return ChatFormat::kChatML;
  }
  if (model_template.find("<start_of_turn>") != std::string::npos) return ChatFormat::kGemma;
  if (model_template.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
  fail(
      "the model's tokenizer.chat_template is none of ChatML, Gemma or Llama 3 (no "
      "<|im_start|>, <start_of_turn> or <|start_header_id|> markers); pass --chat-template "
      "chatml, gemma or llama3 to force one");
}

const char* chat_end_marker(ChatFormat f) {
  switch (f) {
    case ChatFormat::kGemma:
      return "<end_of_turn>";
    case ChatFormat::kLlama3:
      return "<|eot_id|>";
    case ChatFormat::kChatML:
      break;
  }
  return "<|im_end|>";
}

const char* chat_turn_gap(ChatFormat f) {
  return f == ChatFormat::kLlama3 ? "" : "\n";
}

namespace {

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r") - b + 1);
}

}  // namespace

std::string render_chat(ChatFormat f, std::span<const ChatMessage> messages,
                        bool add_generation_prompt,
                        std::vector<std::pair<size_t, size_t>>* content) {
  if (f == ChatFormat::kChatML) return render_chatml(messages, add_generation_prompt, content);
  std::string out;
  const auto put = [&](const std::string& text) {
    if (content) content->emplace_back(out.size(), out.size() + text.size());
    out += text;
  };
  if (f == ChatFormat::kGemma) {
    size_t i = 0;
    const ChatMessage* system = nullptr;  // goes in front of the first user turn
    if (!messages.empty() && messages[0].role == "system") {
      system = &messages[0];
      i = 1;
    }
    for (bool first = true; i < messages.size(); ++i, first = false) {
      const ChatMessage& m = messages[i];
      out += "<start_of_turn>";
      out += m.role == "assistant" ? "model" : m.role;
      out += '\n';
      if (first && system) {
        put(trimmed(system->content));
        out += "\n\n";
      }
      put(trimmed(m.content));
      out += "<end_of_turn>\n";
    }
    if (add_generation_prompt) out += "<start_of_turn>model\n";
    return out;
  }
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    put(trimmed(m.content));
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string template_default_system(const std::string& model_template) {
  const std::string head = std::string(kImStart) + "system\n";
  const size_t at = model_template.find(head);
  if (at == std::string::npos) return "";
  const size_t from = at + head.size();
  const size_t end = model_template.find(kImEnd, from);
  if (end == std::string::npos) return "";
  std::string text = model_template.substr(from, end - from);
  // Only a literal prompt counts: anything with template syntax is the message's own content.
  if (text.empty() || text.find_first_of("{}'\"") != std::string::npos) return "";
  return text;
}

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                          std::vector<std::pair<size_t, size_t>>* content) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += kImStart;
    out += m.role;
    out += '\n';
    if (content) content->emplace_back(out.size(), out.size() + m.content.size());
    out += m.content;
    out += kImEnd;
    out += '\n';
  }
  if (add_generation_prompt) {
    out += kImStart;
    out += "assistant\n";
  }
  return out;
}

}  // namespace smolrt
