// Model weights on the GPU: uploaded once, into ONE device allocation, kept in their GGUF types
// (Q4_0/Q8_0 repacked losslessly into the split layout of cuda/dev_mat.h; F32/F16 byte-copied).
// A tied lm_head shares the embedding's bytes (no second copy); nothing is dequantized.
#pragma once

#include <vector>

#include "cuda/dense_gemm.h"
#include "cuda/dev_mat.h"
#include "cuda/device_buffer.h"
#include "model/model.h"

namespace smolrt::cuda {

struct DevLayer {
  const float* attn_norm = nullptr;  // [dim]
  DevMat wq, wk, wv;                 // rows q_dim | kv_dim | kv_dim, cols dim
  DevMat wo;                         // rows dim, cols q_dim
  const float* ffn_norm = nullptr;   // [dim]
  DevMat w_gate, w_up;               // rows hidden_dim, cols dim
  DevMat w_down;                     // rows dim, cols hidden_dim
  // The architecture's optional vectors (model/model.h), nullptr when the model has none:
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;          // [q_dim], [kv_dim], [kv_dim]
  const float *q_norm = nullptr, *k_norm = nullptr;                 // [head_dim]
  const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // [dim]
};

struct DeviceWeights {
  DeviceBuffer buffer;                 // the one allocation
  DevMat token_embd;                   // rows vocab, cols dim
  const float* output_norm = nullptr;  // [dim]
  DevMat output;                       // rows vocab, cols dim (== token_embd's bytes when tied)
  std::vector<DevLayer> layers;
  const float* rope_factors = nullptr;  // [rope_dim / 2] llama3 frequency factors, or nullptr
  size_t bytes = 0;                     // size of the allocation
};

// fp16 copies of the layer matrices and the lm_head (dense_gemm.h) for the large-batch GEMMs: two
// bytes per weight beside the quantized image, built on the device from it.
struct DenseWeights {
  DeviceBuffer buffer;
  std::vector<DenseLayer> layers;
  const uint16_t* output = nullptr;  // [vocab][dim]
  size_t bytes = 0;
};
// Bytes make_dense would allocate for this model.
size_t dense_bytes(const ModelConfig& c);
DenseWeights make_dense(const DeviceWeights& dw, const ModelConfig& c);

// Checks every tensor has a CUDA kernel for its type and shape (Error names the tensor, its type
// and the supported ones), then uploads. Throws the out-of-memory Error from device_buffer.h.
DeviceWeights upload_weights(const Weights& w, const ModelConfig& c);

// Building blocks (also used by the kernel tests): bytes of t's device image, and writing that
// image to host staging memory `dst` for a device copy at `dev` (returns the DevMat for `dev`).
size_t device_bytes(const TensorView& t);
DevMat stage_matrix(const TensorView& t, uint8_t* dst, const uint8_t* dev);

}  // namespace smolrt::cuda
