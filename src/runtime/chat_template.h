// Chat templates: ChatML (SmolLM2, Qwen2), Gemma (<start_of_turn>) and Llama 3 (header ids)
// rendering, and picking the format from the model's tokenizer.chat_template or the
// --chat-template option. No Jinja: each format is detected by its markers and rendered by hand,
// as the models' own templates render (BOS is the tokenizer's, not the text's).
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

namespace smolrt {

// One tool call an assistant message made (OpenAI's message.tool_calls[i]).
struct ChatToolCall {
  std::string id;         // "call_..."
  std::string name;       // the function
  std::string arguments;  // its arguments as JSON text (OpenAI sends them as a string)
};

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool" (runtime/tools.h renders tools)
  std::string content;  // plain text, no template markers
  std::vector<ChatToolCall> tool_calls = {};  // assistant: the calls it made
  std::string tool_call_id = {};              // tool: the call this message answers
};

enum class ChatFormat { kChatML, kGemma, kLlama3 };

// Picks the chat format. option: "" or "auto" = from the model's tokenizer.chat_template (ChatML
// when it has <|im_start|> and <|im_end|>, Gemma with <start_of_turn>, Llama 3 with
// <|start_header_id|>), or "chatml" | "gemma" | "llama3" = forced. Throws Error naming
// --chat-template for an unknown option, a model without a template, or an unknown template.
ChatFormat resolve_chat_format(const std::string& option, const std::string& model_template);

// The text that ends a turn (a control token in the models' vocabularies): "<|im_end|>",
// "<end_of_turn>" or "<|eot_id|>".
const char* chat_end_marker(ChatFormat f);
// What the format writes after an end marker before the next turn ("\n" for ChatML and Gemma).
const char* chat_turn_gap(ChatFormat f);

// The conversation in format f (ChatML: render_chatml). Gemma (Gemma 3's template): a system
// message goes in front of the first user message followed by a blank line; roles user and model
// ("assistant"); each "<start_of_turn>{role}\n{trimmed content}<end_of_turn>\n"; generation
// prompt "<start_of_turn>model\n". Llama 3: "<|start_header_id|>{role}<|end_header_id|>\n\n
// {trimmed content}<|eot_id|>"; generation prompt the assistant header.
// content: when given, receives the byte range [first, second) of each message's content in the
// result (for tokenizing it as plain text: Tokenizer::encode's `plain`).
std::string render_chat(ChatFormat f, std::span<const ChatMessage> messages,
                        bool add_generation_prompt,
                        std::vector<std::pair<size_t, size_t>>* content = nullptr);

// The default system prompt a ChatML template writes when the conversation has none (SmolLM2:
// "You are a helpful AI assistant named SmolLM, trained by Hugging Face"); "" when it has none.
std::string template_default_system(const std::string& model_template);

// ChatML: per message "<|im_start|>{role}\n{content}<|im_end|>\n"; then, when
// add_generation_prompt, "<|im_start|>assistant\n".
std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                          std::vector<std::pair<size_t, size_t>>* content = nullptr);

}  // namespace smolrt
