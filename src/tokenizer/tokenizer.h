// Tokenizers from GGUF metadata (or a Hugging Face tokenizer.json): byte-level BPE ("gpt2" with
// pre-tokenizers "gpt-2", "smollm", "starcoder") and SentencePiece-style BPE ("llama").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smolrt {
namespace gguf {
class File;
class Writer;
}  // namespace gguf

// Token types as GGUF stores them (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// Everything a tokenizer needs, as plain data (also what `synth` writes into a GGUF).
struct VocabData {
  std::string model;                 // "gpt2" (byte-level BPE) | "llama" (SPM)
  std::string pre;                   // "gpt-2" (default when absent), "smollm", "starcoder"
  std::vector<std::string> tokens;   // id -> piece (byte-level encoded for gpt2, "▁" for SPM)
  std::vector<int32_t> token_types;  // id -> TokenType (Normal when absent)
  std::vector<float> scores;         // SPM merge scores (empty for gpt2)
  std::vector<std::string> merges;   // BPE merges "a b", rank = index (empty for SPM)
  int bos = -1, eos = -1, unk = -1, pad = -1, eot = -1;  // -1 = none
  bool add_bos = false;                                  // SPM: true when absent
  bool add_eos = false;
  // SPM: "▁" prepended to the text and to each text run after a token written in the text
  // (tokenizer.ggml.add_space_prefix; true when absent, as llama.cpp; Gemma's files say false).
  bool add_space_prefix = false;
  // BPE: a pre-tokenized word that is itself a token skips the merges. -1: as llama.cpp decides
  // by the pre-tokenizer (on for llama-bpe), 0/1: as a tokenizer.json's model.ignore_merges says.
  int ignore_merges = -1;
  std::string chat_template;  // tokenizer.chat_template ("" when absent)
};

// Throws Error naming the key when the metadata is missing or malformed.
VocabData vocab_from_gguf(const gguf::File& f);
// A Hugging Face tokenizer.json (+ its special tokens); pre = "smollm" for SmolLM2's.
VocabData vocab_from_hf_json(const std::string& path);
// Writes the tokenizer.ggml.* keys (and tokenizer.chat_template when non-empty).
void vocab_to_gguf(const VocabData& v, gguf::Writer& w);

class Tokenizer {
 public:
  explicit Tokenizer(VocabData v);  // throws Error for an unknown model or pre-tokenizer name
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // parse_special: control (and unknown) tokens written in the text become their ids;
  // user-defined tokens always do (as in Hugging Face and llama.cpp). SPM with add_space_prefix
  // prepends "▁" to the text and to each text run after such a token. add_bos: -1 = as the vocab
  // says, 0 = no, 1 = yes (add_eos follows the vocab unless add_bos is 0). Invalid UTF-8 is
  // tokenized as bytes; a byte the vocab has no token for becomes unk, or is dropped when there is
  // no unk. `plain`: sorted, disjoint byte ranges [first, second) of the text that are read as
  // with parse_special false (chat message content that must not turn into control tokens).
  std::vector<int> encode(std::string_view text, bool parse_special = true, int add_bos = -1,
                          std::span<const std::pair<size_t, size_t>> plain = {}) const;
  // Exact inverse of encoding (control tokens render as their text only when `special` is true).
  std::string decode(std::span<const int> ids, bool special = false) const;
  // The bytes token `id` adds to the text after an ordinary token (mid-text: SPM's "▁" is a
  // space here); "" for control, unknown and unused tokens. What a grammar matcher compares with
  // grammar text. Error for an out-of-range id.
  std::string token_text(int id) const;
  // The piece for display (e.g. "Ġthe"); Error for an out-of-range id.
  const std::string& piece(int id) const;

  int n_vocab() const;
  const VocabData& vocab() const;
  bool is_eog(int id) const;  // eos / eot / other end-of-generation ids

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streaming decoder: feed ids one at a time, get text that never ends inside a UTF-8 character;
// handles SPM's leading space (dropped from the first piece, and after control tokens, exactly as
// decode() does, so the concatenated output equals decode() of the same ids). flush() returns
// whatever bytes are still held (an unfinished character) and starts a new sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& t, bool special = false);
  std::string push(int id);
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace smolrt
