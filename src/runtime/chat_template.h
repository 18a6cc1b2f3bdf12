// Chat templates: ChatML (what SmolLM2 uses) rendering, and picking the format from the model's
// tokenizer.chat_template or the --chat-template option. No Jinja: ChatML is detected by its
// markers and rendered by hand.
#pragma once

#include <span>
#include <string>

namespace smolrt {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;  // plain text, no template markers
};

enum class ChatFormat { kChatML };

// Picks the chat format. option: "" or "auto" = from the model's tokenizer.chat_template (ChatML
// when it contains both <|im_start|> and <|im_end|>), "chatml" = forced. Throws Error naming
// --chat-template for an unknown option, a model without a template, or a non-ChatML template.
ChatFormat resolve_chat_format(const std::string& option, const std::string& model_template);

// The default system prompt a ChatML template writes when the conversation has none (SmolLM2:
// "You are a helpful AI assistant named SmolLM, trained by Hugging Face"); "" when it has none.
std::string template_default_system(const std::string& model_template);

// ChatML: per message "<|im_start|>{role}\n{content}<|im_end|>\n"; then, when
// add_generation_prompt, "<|im_start|>assistant\n".
std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt);

}  // namespace smolrt
