// ChatML rendering (expected text written by hand from the ChatML rules) and template detection.
#include <gtest/gtest.h>

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
  expect_error_naming_option("llama3", kSmolLM2Template);  // unknown option
  expect_error_naming_option("", "");                      // model without a template
  expect_error_naming_option("auto", "{{ bos_token }}[INST] {{ content }} [/INST]");  // not ChatML
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
