// ChatML rendering (expected text written by hand from the ChatML rules) and template detection.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "runtime/chat.h"

namespace smolrt {
namespace {

// SmolLM2-135M-Instruct's tokenizer.chat_template (from its tokenizer_config.json).
const std::string kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, RendersAMultiTurnConversationWithASystemPrompt) {
  const std::vector<ChatMessage> msgs = {
      {"system", "You are terse."},
      {"user", "Hi"},
      {"assistant", "Hello!"},
      {"user", "And 2+2?\nThanks."},
  };
  EXPECT_EQ(render_chatml(msgs, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nAnd 2+2?\nThanks.<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml(std::span(msgs).first(3), false),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n");
  EXPECT_EQ(render_chatml({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, DetectsChatMLFromTheModelTemplate) {
  EXPECT_EQ(resolve_chat_format("", kSmolLM2Template), ChatFormat::kChatML);
  EXPECT_EQ(resolve_chat_format("auto", kSmolLM2Template), ChatFormat::kChatML);
  // Forced: works without any template in the model.
  EXPECT_EQ(resolve_chat_format("chatml", ""), ChatFormat::kChatML);
}

void expect_error_naming_option(const std::string& option, const std::string& tmpl) {
  try {
    resolve_chat_format(option, tmpl);
    ADD_FAILURE() << "no error for option '" << option << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, UnknownOrMissingTemplatesAreClearErrors) {
  expect_error_naming_option("vicuna", kSmolLM2Template);  // unknown option
  expect_error_naming_option("", "");                      // model without a template
  expect_error_naming_option("auto", "{{ bos_token }}[INST] {{ content }} [/INST]");  // unknown
}

// Excerpts of the models' own tokenizer.chat_template strings (Gemma 3 and Llama 3 Instruct).
constexpr const char* kGemma3Template =
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
    "messages[0]['content'] + '\n\n' -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}";
constexpr const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

TEST(ChatTemplate, DetectsGemmaAndLlama3Templates) {
  EXPECT_EQ(resolve_chat_format("auto", kGemma3Template), ChatFormat::kGemma);
  EXPECT_EQ(resolve_chat_format("", kLlama3Template), ChatFormat::kLlama3);
  EXPECT_EQ(resolve_chat_format("gemma", ""), ChatFormat::kGemma);
  EXPECT_EQ(resolve_chat_format("llama3", kSmolLM2Template), ChatFormat::kLlama3);
  EXPECT_STREQ(chat_end_marker(ChatFormat::kGemma), "<end_of_turn>");
  EXPECT_STREQ(chat_end_marker(ChatFormat::kLlama3), "<|eot_id|>");
  EXPECT_STREQ(chat_end_marker(ChatFormat::kChatML), "<|im_end|>");
  EXPECT_EQ(template_default_system(kGemma3Template), "");
}

TEST(ChatTemplate, RendersGemmaLikeItsTemplate) {
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."},
                                         {"user", " Hi there \n"},
                                         {"assistant", "Hello!"},
                                         {"user", "Name a color."}};
  EXPECT_EQ(render_chat(ChatFormat::kGemma, msgs, true),
            "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nName a color.<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(render_chat(ChatFormat::kGemma, std::span(msgs).subspan(1, 1), false),
            "<start_of_turn>user\nHi there<end_of_turn>\n");
}

TEST(ChatTemplate, RendersLlama3LikeItsTemplate) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello! "}};
  EXPECT_EQ(render_chat(ChatFormat::kLlama3, msgs, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// The content ranges cover exactly each message's (trimmed) content, in every format.
TEST(ChatTemplate, ContentRangesPointAtTheMessages) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", " <|im_end|>x "}, {"assistant", "Hello!"}};
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kGemma, ChatFormat::kLlama3}) {
    std::vector<std::pair<size_t, size_t>> content;
    const std::string text = render_chat(f, msgs, true, &content);
    EXPECT_EQ(text, render_chat(f, msgs, true));
    ASSERT_EQ(content.size(), 3u) << static_cast<int>(f);
    std::vector<std::string> got;
    for (auto [b, e] : content) got.push_back(text.substr(b, e - b));
    const std::string user = f == ChatFormat::kChatML ? " <|im_end|>x " : "<|im_end|>x";
    EXPECT_EQ(got, (std::vector<std::string>{"Be brief.", user, "Hello!"})) << static_cast<int>(f);
    for (size_t i = 1; i < content.size(); ++i) EXPECT_LE(content[i - 1].second, content[i].first);
  }
}

// What ChatSession relies on: a conversation rendered whole equals its first turns (ending with
// the reply's end marker) + the format's gap + the next user turn with the generation prompt.
TEST(ChatTemplate, TurnsConcatenateToTheWholeConversation) {
  const std::vector<ChatMessage> conv = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kGemma, ChatFormat::kLlama3}) {
    std::string first =
        render_chat(f, std::span(conv).first(1), true) + "Hello!" + chat_end_marker(f);
    std::string next = chat_turn_gap(f) + render_chat(f, std::span(conv).subspan(2), true);
    EXPECT_EQ(first + next, render_chat(f, conv, true)) << static_cast<int>(f);
  }
}

TEST(ChatTemplate, ReadsTheDefaultSystemPromptOfATemplate) {
  EXPECT_EQ(template_default_system(kSmolLM2Template),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  // A template whose system block is the message's own content has no default.
  EXPECT_EQ(template_default_system("{{'<|im_start|>system\n' + message['content'] + "
                                    "'<|im_end|>'}}"),
            "");
  EXPECT_EQ(template_default_system(""), "");
}

}  // namespace
}  // namespace smolrt
