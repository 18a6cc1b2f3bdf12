// Helpers for the GPU tests: visible skip without a GPU, device buffers, random GGUF-typed
// matrices and their device images.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_weights.h"
#include "core/cuda_check.h"
#include "core/env.h"
#include "cuda/device_buffer.h"
#include "model/model.h"
#include "quant/formats.h"

#define REQUIRE_GPU()                      \
  if (::smolrt::cuda_device_available()) { \
  } else                                   \
    GTEST_SKIP() << "skipped: no CUDA GPU"

// A GPU and the synthetic SmolLM-135M-shaped Q4_0 model named by SMOLRT_SYNTH_MODEL (made by
// `smolrt synth`), loaded once per test binary into `model`; skips visibly otherwise.
#define REQUIRE_SYNTH(model)                                                         \
  REQUIRE_GPU();                                                                     \
  const Model* synth_model_ = ::smolrt::test::synth_model();                         \
  if (synth_model_ == nullptr) {                                                     \
    GTEST_SKIP() << "skipped: SMOLRT_SYNTH_MODEL not set or missing (make one with " \
                    "`smolrt synth --preset smollm-135m --type q4_0 ...`)";          \
  }                                                                                  \
  const Model& model = *synth_model_

namespace smolrt::test {

// The model at SMOLRT_SYNTH_MODEL, loaded on first use (loading maps the file; backends upload
// it); nullptr when the variable is unset or the file is missing.
inline const Model* synth_model() {
  static const std::unique_ptr<Model> m = []() -> std::unique_ptr<Model> {
    const std::string p = env_string("SMOLRT_SYNTH_MODEL");
    if (p.empty() || !std::filesystem::exists(p)) return nullptr;
    return std::make_unique<Model>(load_model(p));
  }();
  return m.get();
}

// Device copy of a host vector; poisons (NaN bytes) when host is empty and n given.
template <class T>
struct Dev {
  cuda::DeviceBuffer buf;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : buf(h.size() * sizeof(T) + 16, "test"), n(h.size()) {
    CUDA_CHECK(cudaMemcpy(buf.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t count) : buf(count * sizeof(T) + 16, "test"), n(count) { poison(); }
  void poison() { CUDA_CHECK(cudaMemset(buf.get(), 0xff, n * sizeof(T))); }
  T* p() const { return static_cast<T*>(buf.get()); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// A random matrix in a GGUF type: host bytes (as in a GGUF file) + TensorView + device image.
struct RandMat {
  std::vector<uint8_t> bytes;
  TensorView view;
  cuda::DeviceBuffer dev;
  cuda::DevMat mat;

  // Float formats: N(0, 1/cols) weights. Block formats: random quant bytes (every bit pattern
  // of the quants, high bits and sub-block scales occurs) with fp16 scales drawn so weights have
  // magnitudes like a trained layer's (never zero blocks), minima negative as the quantizers make
  // them.
  RandMat(GgmlType t, int rows, int cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> scale(0.002f, 0.05f);
    const TypeInfo& ti = *type_info(t);
    const size_t nbytes = (size_t)rows * (cols / ti.block_size) * ti.block_bytes;
    const size_t nblk = (size_t)rows * (cols / ti.block_size);
    bytes.resize(nbytes);
    const float w_scale = 1.f / std::sqrt((float)cols);
    auto put = [&](size_t blk, int off, float v) {
      const uint16_t h = f32_to_fp16(v);
      std::memcpy(bytes.data() + blk * ti.block_bytes + off, &h, 2);
    };
    if (t == GgmlType::F32) {
      float* f = reinterpret_cast<float*>(bytes.data());
      for (size_t i = 0; i < (size_t)rows * cols; ++i) f[i] = nd(rng) * w_scale;
    } else if (t == GgmlType::F16 || t == GgmlType::BF16) {
      uint16_t* h = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < (size_t)rows * cols; ++i) {
        const float v = nd(rng) * w_scale;
        h[i] = t == GgmlType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
      }
    } else {
      std::uniform_int_distribution<int> byte(0, 255);
      for (uint8_t& b : bytes) b = (uint8_t)byte(rng);
      for (size_t b = 0; b < nblk; ++b) {
        const float s = scale(rng);
        switch (t) {
          case GgmlType::Q4_0:
            put(b, 0, s);
            break;
          case GgmlType::Q8_0:
            put(b, 0, s / 8.f);
            break;
          case GgmlType::Q5_0:
            put(b, 0, s / 2.f);
            break;
          case GgmlType::Q4_1:
            put(b, 0, s), put(b, 2, -8.f * s);
            break;
          case GgmlType::Q5_1:
            put(b, 0, s / 2.f), put(b, 2, -8.f * s);
            break;
          case GgmlType::Q4_K:  // w = d*sc*q - dmin*m, sc and m 6-bit
          case GgmlType::Q5_K:
            put(b, 0, s / 32.f), put(b, 2, s / 8.f);
            break;
          case GgmlType::Q6_K:
            put(b, 208, s / 64.f);
            break;  // int8 sub-block scales
          default:
            throw std::runtime_error("RandMat: no generator for this type");
        }
      }
    }
    view.name = "test.weight";
    view.type = t;
    view.rows = rows;
    view.cols = cols;
    view.data = bytes.data();
    view.nbytes = nbytes;
    const size_t db = cuda::device_bytes(view);
    dev = cuda::DeviceBuffer(db, "test matrix");
    std::vector<uint8_t> image(db);
    mat = cuda::stage_matrix(view, image.data(), static_cast<const uint8_t*>(dev.get()));
    CUDA_CHECK(cudaMemcpy(dev.get(), image.data(), db, cudaMemcpyHostToDevice));
  }
};

// The near-tie bound of a reference logits row: two tokens whose reference logits are within 0.1
// RMS of the row may come out in either order from paths that differ by rounding (random weights
// over 49k tokens give top-2 gaps of ~0.2 RMS on average; the paths' per-element errors are
// ~1e-3 RMS).
inline double near_tie_bound(const float* logits, size_t n) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += (double)logits[i] * logits[i];
  return 0.1 * std::sqrt(ss / (double)n);
}

// Max |a-b| / max(|b|, floor) over a vector, for reporting.
inline double max_rel(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs((double)a[i] - b[i]) / std::max(std::fabs((double)b[i]), floor));
  }
  return m;
}

}  // namespace smolrt::test
