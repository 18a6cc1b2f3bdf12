#include "backend/cuda/device_weights.h"

#include <chrono>
#include <climits>
#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/qformat.h"

namespace smolrt::cuda {
namespace {

void check_matrix(const TensorView& t, const char* role) {
  const DevLayout l = dev_layout(t.type);
  if (l.qk == 0) {
    fail("tensor '", t.name, "' (", role, ") has type ", type_name(t.type),
         ", which has no CUDA kernel (supported: ", kDeviceFormats,
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
