#include "model/synth.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/mix64.h"
#include "core/parallel_for.h"
#include "model/quantize_model.h"
#include "quant/quantize.h"

namespace smolrt {

namespace {

// --- presets -------------------------------------------------------------------------------------

const std::vector<SynthPreset> kPresets = {
    // SmolLM2-135M: head_dim 64, tied embeddings.
    {"smollm-135m", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0f, 1e-5f},
    // SmolLM2-360M: head_dim 64, tied embeddings.
    {"smollm-360m", 960, 32, 15, 5, 2560, 49152, 8192, 100000.0f, 1e-5f},
    // The same shape under its model's name. HuggingFaceTB/SmolLM2-360M config.json: hidden_size
    // 960, intermediate_size 2560, num_hidden_layers 32, num_attention_heads 15,
    // num_key_value_heads 5, vocab_size 49152, max_position_embeddings 8192, rope_theta 100000,
    // rms_norm_eps 1e-5, tie_word_embeddings true.
    {"smollm2-360m", 960, 32, 15, 5, 2560, 49152, 8192, 100000.0f, 1e-5f},
    // HuggingFaceTB/SmolLM2-1.7B config.json: hidden_size 2048, intermediate_size 8192,
    // num_hidden_layers 24, num_attention_heads 32, num_key_value_heads 32 (no grouping),
    // vocab_size 49152, max_position_embeddings 8192, rope_theta 130000, rms_norm_eps 1e-5,
    // tie_word_embeddings true. head_dim 64; every row length a multiple of 256.
    {"smollm2-1.7b", 2048, 24, 32, 32, 8192, 49152, 8192, 130000.0f, 1e-5f},
    // Seconds-fast tests: head_dim 16, GQA 2:1, all row lengths multiples of 32.
    {"tiny", 64, 2, 4, 2, 192, 0, 512, 10000.0f, 1e-5f},
    // Qwen/Qwen2.5-0.5B config.json: hidden_size 896, intermediate_size 4864, num_hidden_layers
    // 24, num_attention_heads 14, num_key_value_heads 2 (head_dim 64), vocab_size 151936,
    // max_position_embeddings 32768, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings true;
    // q/k/v biases.
    {"qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, 32768, 1e6f, 1e-6f, "qwen2"},
    // meta-llama/Llama-3.2-1B config.json: hidden_size 2048, intermediate_size 8192,
    // num_hidden_layers 16, num_attention_heads 32, num_key_value_heads 8 (head_dim 64),
    // vocab_size 128256, max_position_embeddings 131072, rope_theta 500000, rms_norm_eps 1e-5,
    // tie_word_embeddings true, rope_scaling {rope_type llama3, factor 32, low_freq_factor 1,
    // high_freq_factor 4, original_max_position_embeddings 8192}.
    {"llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.f, 1e-5f, "llama", 0, true, 32.f,
     1.f, 4.f, 8192},
    // google/gemma-3-270m config.json: hidden_size 640, intermediate_size 2048, num_hidden_layers
    // 18, num_attention_heads 4, num_key_value_heads 1, head_dim 256, vocab_size 262144,
    // max_position_embeddings 32768, rope_theta 1e6 (rope_local_base_freq 10000), rms_norm_eps
    // 1e-6, sliding_window 512 (every 6th layer global), query_pre_attn_scalar 256, tied.
    {"gemma3-270m", 640, 18, 4, 1, 2048, 262144, 32768, 1e6f, 1e-6f, "gemma3", 256, true, 0.f, 1.f,
     4.f, 8192, 512},
    // Seconds-fast family models: dim 256 and hidden 512 so every matrix row is whole 256-weight
    // super-blocks (a q4_k model is Q4_K throughout), 2 layers, 4 heads / 2 KV heads, the byte
    // vocab. tiny-qwen2: biases. tiny-llama3: llama3 frequency factors and an untied output.weight;
    // its "original context" is 64 (not 8192) so the factors reach fast-turning pairs and matter
    // within a short prompt (rope base 500000, head_dim 64: pairs 0-2 keep factor 1, 3-5 are
    // blended, 6-31 take 32). tiny-gemma3: 4 layers, head_dim 128 != dim / n_heads = 64 (q_dim
    // 512), a
    // window of 8 and layers local, local, global, local.
    {"tiny-qwen2", 256, 2, 4, 2, 512, 0, 512, 1e6f, 1e-6f, "qwen2"},
    {"tiny-llama3", 256, 2, 4, 2, 512, 0, 512, 500000.f, 1e-5f, "llama", 0, false, 32.f, 1.f, 4.f,
     64},
    {"tiny-gemma3",
     256,
     4,
     4,
     2,
     512,
     0,
     512,
     1e6f,
     1e-6f,
     "gemma3",
     128,
     true,
     0.f,
     1.f,
     4.f,
     8192,
     8,
     {1, 1, 0, 1}},
};

// --- counter-based normal generator --------------------------------------------------------------

uint64_t stream_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the tensor name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(mix64(seed) ^ h);
}

// Inverse of the standard normal CDF by P. J. Acklam's rational approximation (relative error
// 1.2e-9 in double; evaluated in float here), for p in (0, 0.5]. The central region
// (p >= 0.02425, 95% of draws) is one rational function without a libm call, computed for a
// whole row in a branch-free loop the compiler vectorizes; the tails are patched afterwards.
// About 4x cheaper than Box-Muller's log + sqrt + sincos per element.
constexpr float kA[6] = {-3.969683028665376e+01f, 2.209460984245205e+02f,  -2.759285104469687e+02f,
                         1.383577518672690e+02f,  -3.066479806614716e+01f, 2.506628277459239e+00f};
constexpr float kB[5] = {-5.447609879822406e+01f, 1.615858368580409e+02f, -1.556989798598866e+02f,
                         6.680131188771972e+01f, -1.328068155288572e+01f};
constexpr float kC[6] = {-7.784894002430293e-03f, -3.223964580411365e-01f, -2.400758277161838e+00f,
                         -2.549732539343734e+00f, 4.374664141464968e+00f,  2.938163982698783e+00f};
constexpr float kD[4] = {7.784695709041462e-03f, 3.224671290700398e-01f, 2.445134137142996e+00f,
                         3.754408661907416e+00f};
constexpr float kPLow = 0.02425f;

inline float inv_cdf_central(float p) {
  const float q = p - 0.5f, r = q * q;
  return (((((kA[0] * r + kA[1]) * r + kA[2]) * r + kA[3]) * r + kA[4]) * r + kA[5]) * q /
         (((((kB[0] * r + kB[1]) * r + kB[2]) * r + kB[3]) * r + kB[4]) * r + 1.0f);
}

inline float inv_cdf_tail(float p) {
  const float q = std::sqrt(-2.0f * std::log(p));
  return (((((kC[0] * q + kC[1]) * q + kC[2]) * q + kC[3]) * q + kC[4]) * q + kC[5]) /
         ((((kD[0] * q + kD[1]) * q + kD[2]) * q + kD[3]) * q + 1.0f);
}

// Two 23-bit draws per hash of a pair index: element 2j takes the high bits of hash(key, j),
// element 2j + 1 the low bits, so any row split gives the same values.
inline uint64_t pair_hash(uint64_t key, uint64_t j) {
  return mix64(key + j * 0xd1b54a32d192ed03ull);
}

// out[k] = mean + std * z(first + k), z ~ N(0, 1). A draw b (23 bits) means p = (b + 0.5) / 2^23,
// exact in float. The upper half uses the mirror integer (z(b) = -z(2^23 - 1 - b)), so 1 - p is
// never formed: no rounding to 1, no log(0), exact symmetry, |z| <= 5.3. `bits` is scratch for n
// values.
void fill_normal(uint64_t key, uint64_t first, int64_t n, float mean, float std, float* out,
                 uint32_t* bits) {
  for (int64_t k = 0; k < n; ++k) {  // scalar: 64-bit multiplies do not vectorize on SSE2
    const uint64_t i = first + static_cast<uint64_t>(k);
    const uint64_t h = pair_hash(key, i >> 1);
    bits[k] = (i & 1u) ? static_cast<uint32_t>(h >> 8) & 0x7fffffu : static_cast<uint32_t>(h >> 41);
  }
  for (int64_t k = 0; k < n; ++k) {  // branch-free: vectorizes
    const uint32_t upper = bits[k] >> 22;
    const uint32_t b = bits[k] ^ ((0u - upper) & 0x7fffffu);
    const float z = inv_cdf_central((static_cast<float>(b) + 0.5f) * (1.0f / 8388608.0f));
    out[k] = bits_to_f32(f32_to_bits(z) ^ (upper << 31));
  }
  for (int64_t k = 0; k < n; ++k) {  // tails: 4.85% of draws
    const uint32_t upper = bits[k] >> 22;
    const uint32_t b = bits[k] ^ ((0u - upper) & 0x7fffffu);
    const float p = (static_cast<float>(b) + 0.5f) * (1.0f / 8388608.0f);
    if (p < kPLow) out[k] = upper ? -inv_cdf_tail(p) : inv_cdf_tail(p);
  }
  for (int64_t k = 0; k < n; ++k) out[k] = mean + std * out[k];
}

// --- GPT-2 byte-to-unicode ------------------------------------------------------------------

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Printable bytes map to themselves; the other 68 take code points 256, 257, ... in byte order.
std::string byte_piece(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
  uint32_t cp = static_cast<uint32_t>(b);
  if (!printable) {
    int n = 0;
    for (int c = 0; c < b; ++c) {
      if (!((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || (c >= 0xae))) ++n;
    }
    cp = 256u + static_cast<uint32_t>(n);
  }
  std::string s;
  append_utf8(s, cp);
  return s;
}

const char* kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

// --- public API ----------------------------------------------------------------------------------

const std::vector<SynthPreset>& synth_presets() {
  return kPresets;
}

const SynthPreset& synth_preset(const std::string& name) {
  for (const SynthPreset& p : kPresets) {
    if (p.name == name) return p;
  }
  std::string names;
  for (const SynthPreset& p : kPresets) names += cat(names.empty() ? "" : ", ", p.name);
  fail("unknown preset '", name, "' for --preset; use one of ", names);
}

VocabData builtin_byte_vocab(int pad_to) {
  VocabData v;
  v.model = "gpt2";
  v.pre = "smollm";
  for (const char* c : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.emplace_back(c);
    v.token_types.push_back(static_cast<int32_t>(TokenType::Control));
  }
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_piece(b));
    v.token_types.push_back(static_cast<int32_t>(TokenType::Normal));
  }
  // A few merges so the BPE path is exercised ("Ġ" = space, "Ċ" = newline); rank = order.
  const char* merges[][2] = {{"Ġ", "t"},   {"h", "e"},  {"Ġ", "a"}, {"i", "n"},
                             {"Ġt", "he"}, {"e", "r"},  {"o", "n"}, {"Ġ", "s"},
                             {"r", "e"},   {"a", "n"},  {"o", "u"}, {"e", "n"},
                             {"Ġ", "w"},   {"in", "g"}, {"Ġ", "o"}, {"Ċ", "Ċ"}};
  for (const auto& m : merges) {
    v.merges.push_back(std::string(m[0]) + " " + m[1]);
    v.tokens.push_back(std::string(m[0]) + m[1]);
    v.token_types.push_back(static_cast<int32_t>(TokenType::Normal));
  }
  for (int i = 0; static_cast<int>(v.tokens.size()) < pad_to; ++i) {
    v.tokens.push_back(cat("<|unused_", i, "|>"));
    v.token_types.push_back(static_cast<int32_t>(TokenType::Unused));
  }
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.pad = 2;
  v.add_bos = false;
  v.chat_template = kChatMl;
  return v;
}

std::vector<float> llama3_rope_factors(const SynthPreset& p, int rope_dim) {
  // convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (read, not copied): per frequency
  // base^(-2i/rope_dim), wavelength 2 pi / freq; short wavelengths keep factor 1, long ones take
  // `factor`, the band between blends 1 / ((1 - smooth) / factor + smooth).
  const double low_wl = p.rope_orig_ctx / p.rope_low, high_wl = p.rope_orig_ctx / p.rope_high;
  std::vector<float> f(static_cast<size_t>(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i) {
    const double freq = std::pow(static_cast<double>(p.rope_base), -2.0 * i / rope_dim);
    const double wl = 2.0 * M_PI / freq;
    double x = 1.0;
    if (wl > low_wl) {
      x = p.rope_factor;
    } else if (wl >= high_wl) {
      const double smooth = (p.rope_orig_ctx / wl - p.rope_low) / (p.rope_high - p.rope_low);
      x = 1.0 / ((1.0 - smooth) / p.rope_factor + smooth);
    }
    f[size_t(i)] = static_cast<float>(x);
  }
  return f;
}

std::vector<TensorShape> synth_tensors(const SynthPreset& p, int n_vocab) {
  const int head_dim = p.hd();
  const auto D = static_cast<uint64_t>(p.dim), H = static_cast<uint64_t>(p.hidden_dim);
  const auto KV = static_cast<uint64_t>(p.n_kv_heads * head_dim);
  const auto QD = static_cast<uint64_t>(p.n_heads * head_dim);
  const auto HD = static_cast<uint64_t>(head_dim);
  std::vector<TensorShape> t;
  auto add = [&t](std::string name, uint64_t cols, uint64_t rows) {
    TensorShape s;
    s.name = std::move(name);
    s.ne[0] = cols;
    s.ne[1] = rows ? rows : 1;
    s.n_dims = rows ? 2 : 1;
    t.push_back(std::move(s));
  };
  // The order llama.cpp's converter writes SmolLM files in (rows 0: a 1-D tensor).
  if (p.rope_factor > 0.f) add("rope_freqs.weight", HD / 2, 0);
  add("token_embd.weight", D, static_cast<uint64_t>(n_vocab));
  for (int l = 0; l < p.n_layers; ++l) {
    const std::string b = cat("blk.", l, ".");
    add(b + "attn_norm.weight", D, 0);
    add(b + "ffn_down.weight", H, D);
    add(b + "ffn_gate.weight", D, H);
    add(b + "ffn_up.weight", D, H);
    add(b + "ffn_norm.weight", D, 0);
    add(b + "attn_k.weight", D, KV);
    add(b + "attn_output.weight", QD, D);
    add(b + "attn_q.weight", D, QD);
    add(b + "attn_v.weight", D, KV);
    if (p.arch == "qwen2") {
      add(b + "attn_q.bias", QD, 0);
      add(b + "attn_k.bias", KV, 0);
      add(b + "attn_v.bias", KV, 0);
    }
    if (p.arch == "gemma3") {
      add(b + "attn_q_norm.weight", HD, 0);
      add(b + "attn_k_norm.weight", HD, 0);
      add(b + "post_attention_norm.weight", D, 0);
      add(b + "post_ffw_norm.weight", D, 0);
    }
  }
  add("output_norm.weight", D, 0);
  if (!p.tied) add("output.weight", D, static_cast<uint64_t>(n_vocab));
  return t;
}

SynthModel synth_model(const SynthOptions& o) {
  const SynthPreset& p = synth_preset(o.preset);
  const VocabData vocab = o.tokenizer_json.empty() ? builtin_byte_vocab(p.vocab_size)
                                                   : vocab_from_hf_json(o.tokenizer_json);
  const int n_vocab = static_cast<int>(vocab.tokens.size());
  const int head_dim = p.hd();

  SynthModel m;
  m.vocab_size = n_vocab;
  gguf::Writer& w = m.writer;
  using gguf::Value;
  w.set("general.architecture", Value::str(p.arch));
  w.set("general.name", Value::str(cat("smolrt synth ", p.name, " seed ", o.seed)));
  w.set("general.file_type", Value::u32(llama_file_type(o.type)));
  w.set("general.quantization_version", Value::u32(2));
  const std::string a = p.arch + ".";
  w.set(a + "context_length", Value::u32(static_cast<uint32_t>(p.n_ctx)));
  w.set(a + "embedding_length", Value::u32(static_cast<uint32_t>(p.dim)));
  w.set(a + "block_count", Value::u32(static_cast<uint32_t>(p.n_layers)));
  w.set(a + "feed_forward_length", Value::u32(static_cast<uint32_t>(p.hidden_dim)));
  w.set(a + "attention.head_count", Value::u32(static_cast<uint32_t>(p.n_heads)));
  w.set(a + "attention.head_count_kv", Value::u32(static_cast<uint32_t>(p.n_kv_heads)));
  w.set(a + "rope.freq_base", Value::f32(p.rope_base));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(p.norm_eps));
  w.set(a + "vocab_size", Value::u32(static_cast<uint32_t>(n_vocab)));
  w.set(a + "rope.dimension_count", Value::u32(static_cast<uint32_t>(head_dim)));
  if (p.head_dim) {
    w.set(a + "attention.key_length", Value::u32(static_cast<uint32_t>(p.head_dim)));
    w.set(a + "attention.value_length", Value::u32(static_cast<uint32_t>(p.head_dim)));
  }
  if (p.sliding_window) {
    w.set(a + "attention.sliding_window", Value::u32(static_cast<uint32_t>(p.sliding_window)));
  }
  if (!p.swa_pattern.empty()) {
    std::vector<Value> on;
    for (uint8_t x : p.swa_pattern) on.push_back(Value::boolean(x != 0));
    w.set(a + "attention.sliding_window_pattern", Value::array(gguf::ValueType::BOOL, on));
  }
  vocab_to_gguf(vocab, w);

  const std::vector<TensorShape> specs = synth_tensors(p, n_vocab);
  const std::vector<TensorPlan> plan = plan_model(specs, o.type);

  m.buffers.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorShape& s = specs[i];
    const bool vec = s.n_dims == 1;
    const uint64_t cols = s.ne[0];
    const GgmlType t = plan[i].type;
    const TypeInfo& ti = *type_info(t);
    const size_t rb = row_bytes(ti, cols);
    const int64_t rows = static_cast<int64_t>(s.ne[1]);
    std::vector<uint8_t>& buf = m.buffers[i];
    buf.resize(rb * static_cast<size_t>(rows));
    const uint64_t key = stream_key(o.seed, s.name);
    const bool bias = s.name.find(".bias") != std::string::npos;
    const float mean = vec && !bias ? 1.0f : 0.0f, std = bias ? 0.1f : vec ? 0.05f : 0.02f;
    if (s.name == "rope_freqs.weight") {  // computed, not random
      const std::vector<float> f = llama3_rope_factors(p, head_dim);
      buf.resize(f.size() * sizeof(float));
      std::memcpy(buf.data(), f.data(), buf.size());
      w.add_tensor(s.name, {cols}, GgmlType::F32, buf.data(), buf.size());
      m.n_params += cols;
      m.tensor_bytes += buf.size();
      continue;
    }
    parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(cols);
      std::vector<uint32_t> bits(cols);
      for (int64_t r = r0; r < r1; ++r) {
        fill_normal(key, static_cast<uint64_t>(r) * cols, static_cast<int64_t>(cols), mean, std,
                    row.data(), bits.data());
        quantize_row(t, row.data(), buf.data() + static_cast<size_t>(r) * rb,
                     static_cast<int64_t>(cols));
      }
    });
    w.add_tensor(s.name, std::vector<uint64_t>(s.ne, s.ne + s.n_dims), t, buf.data(), buf.size());
    m.n_params += cols * s.ne[1];
    m.tensor_bytes += buf.size();
  }
  m.n_tensors = specs.size();
  return m;
}

}  // namespace smolrt
