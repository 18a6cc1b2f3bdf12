#include "backend/cuda/device_weights.h"

#include <chrono>
#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/gemv.h"

namespace smolrt::cuda {
namespace {

bool is_quant(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q8_0;
}

void check_matrix(const TensorView& t, const char* role) {
  const GgmlType ty = t.type;
  if (ty != GgmlType::F32 && ty != GgmlType::F16 && ty != GgmlType::Q4_0 && ty != GgmlType::Q8_0) {
    fail("tensor '", t.name, "' (", role, ") has type ", type_name(ty),
         ", which has no CUDA kernel (supported: f32, f16, q4_0, q8_0); requantize with "
         "`smolrt quantize --type q4_0` or use --backend cpu");
  }
  if (t.cols > kGemvMaxCols) {
    fail("tensor '", t.name, "' has ", t.cols, " columns; the CUDA decode matvec supports up to ",
         kGemvMaxCols, "; use --backend cpu");
  }
  if (is_quant(ty) && t.cols % 32 != 0) {
    fail("tensor '", t.name, "' is ", type_name(ty), " with ", t.cols,
         " columns, not a multiple of 32");
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
  if (!is_quant(t.type)) return t.nbytes;
  const size_t nb = (size_t)t.rows * (t.cols / 32);
  return nb * split_qbytes(t.type) + nb * 2;
}

DevMat stage_matrix(const TensorView& t, uint8_t* dst, const uint8_t* dev) {
  DevMat m;
  m.type = t.type;
  m.rows = (int)t.rows;
  m.cols = (int)t.cols;
  m.q = dev;
  if (!is_quant(t.type)) {
    std::memcpy(dst, t.data, t.nbytes);
    return m;
  }
  const size_t nb = (size_t)t.rows * (t.cols / 32);
  const int qb = split_qbytes(t.type);
  uint8_t* q = dst;
  uint16_t* d = reinterpret_cast<uint16_t*>(dst + nb * qb);
  m.d = reinterpret_cast<const uint16_t*>(dev + nb * qb);
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  const size_t src_block = 2 + qb;  // fp16 d then the quants, as in BlockQ4_0 / BlockQ8_0
  for (size_t b = 0; b < nb; ++b) {
    std::memcpy(&d[b], src + b * src_block, 2);
    std::memcpy(q + b * qb, src + b * src_block + 2, qb);
  }
  return m;
}

DeviceWeights upload_weights(const Weights& w, const LlamaConfig& c) {
  const auto t0 = std::chrono::steady_clock::now();
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
  const bool tied = w.output.data == w.token_embd.data;

  // 2. Lay out: every tensor 256-byte aligned in one image.
  std::vector<const TensorView*> order;
  order.push_back(&w.token_embd);
  if (!tied) order.push_back(&w.output);
  order.push_back(&w.output_norm);
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      order.push_back(t);
    }
  }
  std::vector<size_t> offs;
  size_t total = 0;
  for (const TensorView* t : order) {
    total = (total + 255) & ~size_t{255};
    offs.push_back(total);
    total += device_bytes(*t);
  }
  total = (total + 255) & ~size_t{255};

  DeviceWeights dw;
  dw.buffer = DeviceBuffer(total, "model weights");
  dw.bytes = total;
  std::vector<uint8_t> image(total);
  const uint8_t* dev = static_cast<const uint8_t*>(dw.buffer.get());
  std::vector<DevMat> mats;
  for (size_t i = 0; i < order.size(); ++i) {
    mats.push_back(stage_matrix(*order[i], image.data() + offs[i], dev + offs[i]));
  }
  CUDA_CHECK(cudaMemcpy(dw.buffer.get(), image.data(), total, cudaMemcpyHostToDevice));

  size_t k = 0;
  dw.token_embd = mats[k++];
  dw.output = tied ? dw.token_embd : mats[k++];
  dw.output_norm = static_cast<const float*>(mats[k++].q);
  for (size_t li = 0; li < w.layers.size(); ++li) {
    DevLayer L;
    L.attn_norm = static_cast<const float*>(mats[k++].q);
    L.wq = mats[k++];
    L.wk = mats[k++];
    L.wv = mats[k++];
    L.wo = mats[k++];
    L.ffn_norm = static_cast<const float*>(mats[k++].q);
    L.w_gate = mats[k++];
    L.w_up = mats[k++];
    L.w_down = mats[k++];
    dw.layers.push_back(L);
  }
  (void)c;
  dw.upload_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return dw;
}

}  // namespace smolrt::cuda
