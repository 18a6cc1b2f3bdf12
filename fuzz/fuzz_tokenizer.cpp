// libFuzzer target: arbitrary bytes through encode -> decode -> streaming decode, with the gpt-2
// (byte-level BPE, every byte has a token) and llama-spm (SPM, byte fallback) vocabs and SmolLM2's
// tokenizer.json from the fixtures ($SMOLRT_FIXTURES or ../shared), loaded once. Invariants: no
// crash, ids in range, streaming == one-shot decode, and decode(encode(x)) == x without special
// parsing for gpt-2 and for SPM (unless x holds a literal U+2581, which SPM reads as a space);
// SmolLM2 drops the bytes its vocab lacks (0xC0, 0xF5.., as Hugging Face does), so no exact
// round trip there. Without the fixtures it prints a note and every input is a no-op.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/paths.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Loaded {
  std::unique_ptr<smolrt::Tokenizer> tok;
  bool exact;  // decode(encode(x)) == x for any bytes x (see the top comment)
  bool spm;
};

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded> toks = [] {
    std::vector<Loaded> v;
    const auto dir = smolrt::fixtures_dir();
    for (const char* name : {"vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-llama-spm.gguf",
                             "tokenizers/smollm2-135m/tokenizer.json"}) {
      const std::string path = (dir / name).string();
      try {
        const bool json = path.ends_with(".json");
        auto tok = std::make_unique<smolrt::Tokenizer>(
            json ? smolrt::vocab_from_hf_json(path)
                 : smolrt::vocab_from_gguf(*smolrt::gguf::File::open(path)));
        const bool spm = tok->vocab().model == "llama";
        v.push_back({std::move(tok), !json, spm});
      } catch (const smolrt::Error& e) {
        std::fprintf(stderr, "fuzz_tokenizer: skipping %s: %s\n", name, e.what());
      }
    }
    return v;
  }();
  return toks;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Long inputs add time (SPM merges a whole text at once, ASan-instrumented), not coverage:
  // only the first 512 bytes are used, so the long .inp seeds still count.
  size = std::min<size_t>(size, 512);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& [tok, exact, spm] : tokenizers()) {
    const bool round_trip = exact && !(spm && text.find("\xE2\x96\x81") != std::string_view::npos);
    for (bool special : {false, true}) {
      const std::vector<int> ids = tok->encode(text, special);
      for (int id : ids) {
        if (id < 0 || id >= tok->n_vocab()) std::abort();
      }
      const std::string back = tok->decode(ids, special);
      // Without special parsing, the only tokens are text: the round trip must be exact.
      if (!special && round_trip && back != text) std::abort();
      smolrt::StreamDecoder sd(*tok, special);
      std::string streamed;
      for (int id : ids) streamed += sd.push(id);
      streamed += sd.flush();
      if (streamed != back) std::abort();
    }
  }
  return 0;
}
