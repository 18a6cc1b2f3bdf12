#include "backend/cuda/device_weights.h"

#include <climits>
#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/dequantize.h"
#include "cuda/qformat.h"

namespace smolrt::cuda {
namespace {

void check_matrix(const TensorView& t, const char* role) {
  const DevLayout l = dev_layout(t.type);
  if (l.qk == 0) {
    fail("tensor '", t.name, "' (", role, ") has type ", type_name(t.type),
         ", which has no CUDA kernel (supported: ", format_names(),
         "); requantize with `smolrt quantize --type q4_k_m` (or q8_0) or use --backend cpu");
  }
  if (t.cols % l.qk != 0) {
    fail("tensor '", t.name, "' is ", type_name(t.type), " with ", t.cols,
         " columns, not a multiple of its block size ", l.qk, " (a malformed file)");
  }
  if (t.rows > INT32_MAX || t.cols > INT32_MAX) {
    fail("tensor '", t.name, "' has ", t.rows, " x ", t.cols,
         " elements; the CUDA kernels index rows and columns with 32-bit integers");
  }
}

void check_norm(const TensorView& t) {
  if (t.type != GgmlType::F32) {
    fail("tensor '", t.name, "' has type ", type_name(t.type),
         "; the CUDA backend needs f32 norm weights");
  }
}

}  // namespace

size_t device_bytes(const TensorView& t) {
  const DevLayout l = dev_layout(t.type);
  if (!l.block) return t.nbytes;
  return (size_t)(t.rows * t.cols / l.qk) * (l.pay + l.meta);
}

DevMat stage_matrix(const TensorView& t, uint8_t* dst, const uint8_t* dev) {
  DevMat m;
  m.type = t.type;
  m.rows = (int)t.rows;
  m.cols = (int)t.cols;
  m.q = dev;
  const DevLayout l = dev_layout(t.type);
  if (!l.block) {
    std::memcpy(dst, t.data, t.nbytes);
    return m;
  }
  const size_t nb = (size_t)(t.rows * t.cols / l.qk);
  m.d = reinterpret_cast<const uint16_t*>(dev + nb * l.pay);
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  const size_t src_block = type_info(t.type)->block_bytes;
  dispatch_format(t.type, [&](auto tag) {
    using F = QFormat<decltype(tag)::value>;
    if constexpr (F::kLayout.block) {
      for (size_t b = 0; b < nb; ++b) {
        F::repack(src + b * src_block, dst + b * l.pay, dst + nb * l.pay + b * l.meta);
      }
    }
  });
  return m;
}

DeviceWeights upload_weights(const Weights& w, const ModelConfig& c) {
  // 1. Validate everything before allocating anything.
  check_matrix(w.token_embd, "token embedding");
  check_matrix(w.output, "output / lm_head");
  check_norm(w.output_norm);
  for (const LayerWeights& l : w.layers) {
    check_norm(l.attn_norm);
    check_norm(l.ffn_norm);
    check_matrix(l.wq, "attention Q");
    check_matrix(l.wk, "attention K");
    check_matrix(l.wv, "attention V");
    check_matrix(l.wo, "attention output");
    check_matrix(l.w_gate, "FFN gate");
    check_matrix(l.w_up, "FFN up");
    check_matrix(l.w_down, "FFN down");
    if (l.w_gate.type != l.w_up.type) {
      fail("tensors '", l.w_gate.name, "' (", type_name(l.w_gate.type), ") and '", l.w_up.name,
           "' (", type_name(l.w_up.type),
           ") differ in type; the CUDA gate/up kernel needs one type");
    }
  }
  auto check_vec = [](const TensorView& t, int64_t n, const char* what) {
    if (!t.data) return;
    check_norm(t);
    if (t.rows * t.cols != n)
      fail("tensor '", t.name, "' has ", t.rows * t.cols, " elements; the ", what, " needs ", n);
  };
  for (const LayerWeights& l : w.layers) {
    check_vec(l.bq, c.q_dim(), "Q bias");
    check_vec(l.bk, c.kv_dim(), "K bias");
    check_vec(l.bv, c.kv_dim(), "V bias");
    check_vec(l.q_norm, c.head_dim, "Q norm");
    check_vec(l.k_norm, c.head_dim, "K norm");
    check_vec(l.post_attn_norm, c.dim, "post-attention norm");
    check_vec(l.post_ffn_norm, c.dim, "post-FFN norm");
  }
  const bool tied = w.output.data == w.token_embd.data;
  // The llama3 RoPE frequency factors (a config vector) travel as one more f32 tensor.
  const TensorView factors{"rope_freqs",
                           GgmlType::F32,
                           1,
                           (int64_t)c.rope_freq_factors.size(),
                           c.rope_freq_factors.data(),
                           c.rope_freq_factors.size() * sizeof(float)};

  // 2. Lay out: every tensor present 256-byte aligned in one image; each item says where its
  // device address goes (a matrix view or a vector pointer; absent optional tensors stay null).
  DeviceWeights dw;
  dw.layers.resize(w.layers.size());
  struct Item {
    const TensorView* t;
    DevMat* mat;
    const float** vec;
  };
  std::vector<Item> order;
  auto add_mat = [&](const TensorView& t, DevMat& m) { order.push_back({&t, &m, nullptr}); };
  auto add_vec = [&](const TensorView& t, const float*& v) {
    if (t.data && t.nbytes) order.push_back({&t, nullptr, &v});
  };
  add_mat(w.token_embd, dw.token_embd);
  if (!tied) add_mat(w.output, dw.output);
  add_vec(w.output_norm, dw.output_norm);
  add_vec(factors, dw.rope_factors);
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LayerWeights& l = w.layers[li];
    DevLayer& L = dw.layers[li];
    add_vec(l.attn_norm, L.attn_norm);
    add_mat(l.wq, L.wq);
    add_mat(l.wk, L.wk);
    add_mat(l.wv, L.wv);
    add_mat(l.wo, L.wo);
    add_vec(l.ffn_norm, L.ffn_norm);
    add_mat(l.w_gate, L.w_gate);
    add_mat(l.w_up, L.w_up);
    add_mat(l.w_down, L.w_down);
    add_vec(l.bq, L.bq);
    add_vec(l.bk, L.bk);
    add_vec(l.bv, L.bv);
    add_vec(l.q_norm, L.q_norm);
    add_vec(l.k_norm, L.k_norm);
    add_vec(l.post_attn_norm, L.post_attn_norm);
    add_vec(l.post_ffn_norm, L.post_ffn_norm);
  }
  std::vector<size_t> offs;
  size_t total = 0;
  for (const Item& it : order) {
    total = (total + 255) & ~size_t{255};
    offs.push_back(total);
    total += device_bytes(*it.t);
  }
  total = (total + 255) & ~size_t{255};

  dw.buffer = DeviceBuffer(total, "model weights");
  dw.bytes = total;
  std::vector<uint8_t> image(total);
  const uint8_t* dev = static_cast<const uint8_t*>(dw.buffer.get());
  for (size_t i = 0; i < order.size(); ++i) {
    const DevMat m = stage_matrix(*order[i].t, image.data() + offs[i], dev + offs[i]);
    if (order[i].mat) *order[i].mat = m;
    if (order[i].vec) *order[i].vec = static_cast<const float*>(m.q);
  }
  CUDA_CHECK(cudaMemcpy(dw.buffer.get(), image.data(), total, cudaMemcpyHostToDevice));
  if (tied) dw.output = dw.token_embd;
  return dw;
}

namespace {

// Elements of one layer's dense matrices: QKV, O, gate/up, down.
size_t dense_layer_elems(const ModelConfig& c) {
  const size_t dim = c.dim, qd = c.q_dim(), kv = c.kv_dim(), hid = c.hidden_dim;
  return (qd + 2 * kv) * dim + dim * qd + 2 * hid * dim + dim * hid;
}

}  // namespace

size_t dense_bytes(const ModelConfig& c) {
  return sizeof(uint16_t) *
         (dense_layer_elems(c) * c.n_layers + size_t(c.vocab_size) * size_t(c.dim));
}

DenseWeights make_dense(const DeviceWeights& dw, const ModelConfig& c) {
  DenseWeights d;
  d.bytes = dense_bytes(c);
  d.buffer = DeviceBuffer(d.bytes, "fp16 weight copies (pass --no-f16-weights to go without)");
  uint16_t* p = static_cast<uint16_t*>(d.buffer.get());
  // Each matrix's rows are 16-byte aligned: every dimension is a multiple of 8.
  auto put = [&](const DevMat& m) {
    dequantize(m, p, m.cols, nullptr);
    const uint16_t* at = p;
    p += size_t(m.rows) * m.cols;
    return at;
  };
  for (const DevLayer& L : dw.layers) {
    DenseLayer D;
    D.qkv = put(L.wq);  // Wk and Wv follow Wq's rows
    put(L.wk);
    put(L.wv);
    D.o = put(L.wo);
    D.gate_up = put(L.w_gate);  // W_up follows
    put(L.w_up);
    D.down = put(L.w_down);
    d.layers.push_back(D);
  }
  d.output = put(dw.output);
  CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

}  // namespace smolrt::cuda
