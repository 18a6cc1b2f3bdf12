// libFuzzer target: GGUF parsing and model loading on arbitrary bytes. smolrt::Error is the only
// acceptable failure; crashes, sanitizer reports and leaks are bugs. When a file parses, every
// tensor's bytes are read (ASan checks the data pointers stay in the buffer) and a Writer round
// trip must reproduce the same metadata and tensors in at most the file's size plus one alignment.
// A vocabulary in the metadata is built and run on a short text.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace smolrt;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void exercise_accessors(const gguf::File& f) {
  for (const auto& [key, v] : f.metadata()) {
    try {
      (void)f.get_uint(key);
    } catch (const Error&) {
    }
    try {
      (void)f.get_int(key);
    } catch (const Error&) {
    }
    try {
      (void)f.get_float(key);
    } catch (const Error&) {
    }
    try {
      (void)f.get_string(key);
    } catch (const Error&) {
    }
    try {
      (void)f.get_int_array(key);
    } catch (const Error&) {
    }
    try {
      (void)f.get_float_array(key);
    } catch (const Error&) {
    }
    try {
      (void)f.get_string_array(key);
    } catch (const Error&) {
    }
  }
}

void round_trip(const gguf::File& f) {
  gguf::Writer w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const gguf::TensorInfo& t : f.tensors()) {
    w.add_tensor(t.name, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.type, t.data, t.nbytes);
  }
  const std::vector<uint8_t> bytes = w.to_bytes();
  // What a file declares (alignment, counts, sizes) must not make the write-back outgrow it: the
  // same header, the same tensor bytes, at most one alignment of extra padding.
  check(bytes.size() <= f.file_size() + f.alignment());
  const auto g = gguf::File::parse(bytes, "roundtrip");
  check(g->metadata().size() == f.metadata().size());
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    check(g->metadata()[i].first == f.metadata()[i].first);
    check(g->metadata()[i].second == f.metadata()[i].second);
  }
  check(g->tensors().size() == f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf::TensorInfo& a = f.tensors()[i];
    const gguf::TensorInfo& b = g->tensors()[i];
    check(a.name == b.name && a.type == b.type && a.nbytes == b.nbytes && a.n_dims == b.n_dims);
    check(std::memcmp(a.data, b.data, a.nbytes) == 0);
  }
}

}  // namespace

volatile uint64_t g_fuzz_sink = 0;  // external linkage: the tensor reads cannot be dropped

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::shared_ptr<gguf::File> f;
  try {
    f = gguf::File::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
  } catch (const Error&) {
    return 0;
  }
  uint64_t sum = 0;
  for (const gguf::TensorInfo& t : f->tensors()) {
    for (uint64_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
  }
  g_fuzz_sink = sum;  // keeps the reads: ASan checks every tensor byte lies inside the input
  exercise_accessors(*f);
  round_trip(*f);
  try {  // a vocabulary from hostile metadata: build it and run a short text through it
    const Tokenizer tok(vocab_from_gguf(*f));
    const std::vector<int> ids = tok.encode("Hello, world! <|im_start|> 123 \xe2\x96\x81\xff");
    for (int id : ids) check(id >= 0 && id < tok.n_vocab());
    (void)tok.decode(ids, true);
  } catch (const Error&) {
  }
  try {
    const ModelConfig c = load_config(*f);
    const Weights w = load_weights(*f, c);
    check(w.layers.size() == static_cast<size_t>(c.n_layers));
  } catch (const Error&) {
  }
  return 0;
}
