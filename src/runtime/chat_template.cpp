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
  if (option != "" && option != "auto") {
    fail("unknown --chat-template '", option,
         "'; supported values: chatml, auto (the default: "
         "use the model's tokenizer.chat_template when it is ChatML)");
  }
  if (model_template.empty()) {
    fail(
        "the model has no tokenizer.chat_template; pass --chat-template chatml to chat with the "
        "ChatML format");
  }
  if (model_template.find(kImStart) != std::string::npos &&
      model_template.find(kImEnd) != std::string::npos) {
    return ChatFormat::kChatML;
  }
  fail(
      "the model's tokenizer.chat_template is not ChatML (no <|im_start|>/<|im_end|> markers) "
      "and only ChatML is supported; pass --chat-template chatml to force it");
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

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += kImStart;
    out += m.role;
    out += '\n';
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
