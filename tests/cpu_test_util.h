// Helpers for the CPU backend tests: hand-packed quantized weights (Q4_0/Q4_1/Q8_0 by the
// reference quantizers of facts.md, written independently of the quantize code; Q5_0/Q5_1 and the
// K-quants through quant/quantize.h, whose bytes test_quantize checks), an element decoder written
// straight from the block layouts, and a tiny in-memory llama model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "model/model.h"
#include "quant/formats.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace smolrt::test {

// rows x cols f32 values packed as `type` (cols a multiple of the block size).
inline std::vector<uint8_t> pack(const std::vector<float>& v, int64_t rows, int64_t cols,
                                 GgmlType type) {
  if (type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16 &&
      type != GgmlType::Q4_0 && type != GgmlType::Q4_1 && type != GgmlType::Q8_0) {
    const size_t rb = row_bytes(*type_info(type), static_cast<uint64_t>(cols));
    std::vector<uint8_t> q(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, v.data() + r * cols, q.data() + r * rb, cols);
    return q;
  }
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = v.data() + r * cols;
    if (type == GgmlType::F32) {
      put(x, cols * 4);
      continue;
    }
    if (type == GgmlType::F16 || type == GgmlType::BF16) {
      for (int64_t i = 0; i < cols; ++i) {
        const uint16_t h = type == GgmlType::F16 ? f32_to_fp16(x[i]) : f32_to_bf16(x[i]);
        put(&h, 2);
      }
      continue;
    }
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* xb = x + b * 32;
      if (type == GgmlType::Q4_0) {
        float amax = 0, mx = 0;
        for (int j = 0; j < 32; ++j) {
          if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), mx = xb[j];
        }
        const float d = mx / -8, id = d ? 1 / d : 0;
        BlockQ4_0 blk;
        blk.d = f32_to_fp16(d);
        for (int j = 0; j < 16; ++j) {
          const int lo = std::min(15, (int)(int8_t)(xb[j] * id + 8.5f));
          const int hi = std::min(15, (int)(int8_t)(xb[j + 16] * id + 8.5f));
          blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
        put(&blk, sizeof blk);
      } else if (type == GgmlType::Q4_1) {
        float mn = xb[0], mx = xb[0];
        for (int j = 1; j < 32; ++j) mn = std::min(mn, xb[j]), mx = std::max(mx, xb[j]);
        const float d = (mx - mn) / 15, id = d ? 1 / d : 0;
        BlockQ4_1 blk;
        blk.d = f32_to_fp16(d);
        blk.m = f32_to_fp16(mn);
        for (int j = 0; j < 16; ++j) {
          const int lo = std::min(15, (int)(int8_t)((xb[j] - mn) * id + 0.5f));
          const int hi = std::min(15, (int)(int8_t)((xb[j + 16] - mn) * id + 0.5f));
          blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
        put(&blk, sizeof blk);
      } else {  // Q8_0
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / 127, id = d ? 1 / d : 0;
        BlockQ8_0 blk;
        blk.d = f32_to_fp16(d);
        for (int j = 0; j < 32; ++j) blk.qs[j] = static_cast<int8_t>(std::round(xb[j] * id));
        put(&blk, sizeof blk);
      }
    }
  }
  return out;
}

// Element (r, i) of packed data, decoded straight from the bytes as facts.md describes the
// formats (independent of formats.h's dequant helpers; only the fp16/bf16 converters are shared).
inline double unpack_elem(const std::vector<uint8_t>& d, int64_t cols, GgmlType type, int64_t r,
                          int64_t i) {
  const uint8_t* p = d.data();
  auto h16 = [](const uint8_t* q) { return static_cast<uint16_t>(q[0] | (q[1] << 8)); };
  switch (type) {
    case GgmlType::F32: {
      float f;
      std::memcpy(&f, p + (r * cols + i) * 4, 4);
      return f;
    }
    case GgmlType::F16:
      return fp16_to_f32(h16(p + (r * cols + i) * 2));
    case GgmlType::BF16:
      return bf16_to_f32(h16(p + (r * cols + i) * 2));
    default:
      break;
  }
  if (type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q6_K) {
    // Super-blocks of 256: k = index inside it.
    const int64_t bytes = type == GgmlType::Q4_K ? 144 : type == GgmlType::Q5_K ? 176 : 210;
    const uint8_t* blk = p + (r * (cols / 256) + i / 256) * bytes;
    const int k = static_cast<int>(i % 256);
    if (type == GgmlType::Q6_K) {
      // ql[128] qh[64] scales[16] (int8) d: halves of 128; in a half, quarter q4 = 0..3 of 32
      // weights takes ql[64h + l + 32 (q4 & 1)] low (q4 < 2) or high nibble, bits 2*q4 of
      // qh[32h + l], scale 8h + l/16 + 2*q4.
      const int h = k / 128, q4 = (k % 128) / 32, l = k % 32;
      const uint8_t lb = blk[64 * h + l + 32 * (q4 & 1)];
      const int lo = q4 < 2 ? (lb & 15) : (lb >> 4);
      const int hi = (blk[128 + 32 * h + l] >> (2 * q4)) & 3;
      const int sc = static_cast<int8_t>(blk[192 + 8 * h + l / 16 + 2 * q4]);
      return static_cast<double>(fp16_to_f32(h16(blk + 208))) * sc * ((lo | (hi << 4)) - 32);
    }
    // Q4_K / Q5_K: d, dmin, 12 scale bytes; sub-block s = k / 32 has 6-bit scale and min:
    // s < 4: low 6 bits of bytes s and s+4; s >= 4: nibbles of byte s+4 plus the top 2 bits of
    // bytes s-4 (scale) and s (min).
    const uint8_t* sb = blk + 4;
    const int s = k / 32, l = k % 32;
    const int sc = s < 4 ? (sb[s] & 63) : ((sb[s + 4] & 15) | ((sb[s - 4] >> 6) << 4));
    const int mn = s < 4 ? (sb[s + 4] & 63) : ((sb[s + 4] >> 4) | ((sb[s] >> 6) << 4));
    const uint8_t* qs = blk + (type == GgmlType::Q4_K ? 16 : 48);
    int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
    if (type == GgmlType::Q5_K) q |= ((blk[16 + l] >> s) & 1) << 4;
    return static_cast<double>(fp16_to_f32(h16(blk))) * sc * q -
           static_cast<double>(fp16_to_f32(h16(blk + 2))) * mn;
  }
  const int64_t nb = cols / 32, b = i / 32, j = i % 32;
  if (type == GgmlType::Q5_0 || type == GgmlType::Q5_1) {
    // d (, m), 4 bytes qh (bit j = 5th bit of weight j), 16 bytes of nibbles as Q4_0.
    const bool q51 = type == GgmlType::Q5_1;
    const uint8_t* blk = p + (r * nb + b) * (q51 ? 24 : 22);
    const uint8_t* qh = blk + (q51 ? 4 : 2);
    const uint8_t* qs = qh + 4;
    const int q = (j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4)) | (((qh[j / 8] >> (j % 8)) & 1) << 4);
    const double scale = fp16_to_f32(h16(blk));
    return q51 ? q * scale + fp16_to_f32(h16(blk + 2)) : (q - 16) * scale;
  }
  if (type == GgmlType::Q4_0) {
    const uint8_t* blk = p + (r * nb + b) * 18;
    const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
    return (q - 8) * static_cast<double>(fp16_to_f32(h16(blk)));
  }
  if (type == GgmlType::Q4_1) {
    const uint8_t* blk = p + (r * nb + b) * 20;
    const int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
    return q * static_cast<double>(fp16_to_f32(h16(blk))) + fp16_to_f32(h16(blk + 2));
  }
  const uint8_t* blk = p + (r * nb + b) * 34;
  return static_cast<int8_t>(blk[2 + j]) * static_cast<double>(fp16_to_f32(h16(blk)));
}

// A tensor that owns its packed bytes.
struct OwnedTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
};

inline OwnedTensor make_tensor(const std::string& name, int64_t rows, int64_t cols, GgmlType type,
                               uint32_t seed, float scale) {
  OwnedTensor t;
  t.bytes = pack(randn(size_t(rows * cols), seed, scale), rows, cols, type);
  t.view = TensorView{name, type, rows, cols, nullptr, t.bytes.size()};
  return t;
}

// A tiny llama in memory (no GGUF file): Model plus the storage its views point into.
struct TinyModel {
  std::vector<std::unique_ptr<OwnedTensor>> storage;
  Model model;
};

struct TinySpec {
  int dim = 64, n_layers = 2, n_heads = 8, n_kv_heads = 2, hidden_dim = 96, vocab = 100;
  int n_ctx_train = 64, rope_dim = 8;
  float rope_base = 10000.f;
  bool tied = false;
  // When set: the type of every layer matrix and output.weight (the embedding stays Q8_0 unless
  // embd_type is set too); otherwise the default mix of types below.
  std::optional<GgmlType> layer_type;
  std::optional<GgmlType> embd_type;
};

inline std::unique_ptr<TinyModel> make_tiny_model(const TinySpec& s, uint32_t seed = 1) {
  auto tm = std::make_unique<TinyModel>();
  ModelConfig& c = tm->model.config;
  c.arch = "llama";
  c.dim = s.dim;
  c.n_layers = s.n_layers;
  c.n_heads = s.n_heads;
  c.n_kv_heads = s.n_kv_heads;
  c.head_dim = s.dim / s.n_heads;
  c.hidden_dim = s.hidden_dim;
  c.vocab_size = s.vocab;
  c.n_ctx_train = s.n_ctx_train;
  c.rope_dim = s.rope_dim;
  c.rope_base = s.rope_base;
  c.tied_output = s.tied;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, GgmlType t, float scale) {
    tm->storage.push_back(
        std::make_unique<OwnedTensor>(make_tensor(name, rows, cols, t, seed++, scale)));
    OwnedTensor& o = *tm->storage.back();
    o.view.data = o.bytes.data();
    return o.view;
  };
  auto norm = [&](const std::string& name) {
    TensorView v = add(name, 1, s.dim, GgmlType::F32, 0.2f);
    // Norm weights near 1 (as trained models have), never zero.
    float* f = reinterpret_cast<float*>(tm->storage.back()->bytes.data());
    for (int i = 0; i < s.dim; ++i) f[i] += 1.0f;
    return v;
  };
  Weights& w = tm->model.weights;
  const int q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const float ws = 1.0f / std::sqrt(static_cast<float>(s.dim));
  auto lt = [&](GgmlType dflt) { return s.layer_type.value_or(dflt); };
  w.token_embd =
      add("token_embd.weight", s.vocab, s.dim, s.embd_type.value_or(GgmlType::Q8_0), 1.0f);
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.attn_norm = norm(b + "attn_norm.weight");
    lw.wq = add(b + "attn_q.weight", q_dim, s.dim, lt(GgmlType::Q4_0), 2 * ws);
    lw.wk = add(b + "attn_k.weight", kv_dim, s.dim, lt(GgmlType::Q8_0), 2 * ws);
    lw.wv = add(b + "attn_v.weight", kv_dim, s.dim, lt(GgmlType::F16), ws);
    lw.wo = add(b + "attn_output.weight", s.dim, q_dim, lt(GgmlType::Q4_1), ws);
    lw.ffn_norm = norm(b + "ffn_norm.weight");
    lw.w_gate = add(b + "ffn_gate.weight", s.hidden_dim, s.dim, lt(GgmlType::BF16), ws);
    lw.w_up = add(b + "ffn_up.weight", s.hidden_dim, s.dim, lt(GgmlType::F32), ws);
    lw.w_down = add(b + "ffn_down.weight", s.dim, s.hidden_dim, lt(GgmlType::Q4_0), ws);
    w.layers.push_back(lw);
  }
  w.output_norm = norm("output_norm.weight");
  w.output = s.tied ? w.token_embd : add("output.weight", s.vocab, s.dim, lt(GgmlType::Q4_1), ws);
  return tm;
}

}  // namespace smolrt::test
