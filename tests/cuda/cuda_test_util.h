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
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_weights.h"
#include "core/cuda_check.h"
#include "core/env.h"
#include "cuda/gemv_head.h"
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

// The wide lm_head kernel's process-wide switches (gemv_head.h; the CUDA backend sets them before
// its launches) for one scope, restored after: a kernel test must not run on whatever an earlier
// backend test left there.
struct HeadSwitches {
  bool wide, i8;
  HeadSwitches(bool wide_head, bool head_int8)
      : wide(cuda::wide_head_enabled()), i8(cuda::head_int8_enabled()) {
    cuda::wide_head_enabled() = wide_head;
    cuda::head_int8_enabled() = head_int8;
  }
  ~HeadSwitches() {
    cuda::wide_head_enabled() = wide;
    cuda::head_int8_enabled() = i8;
  }
};

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

  RandMat(GgmlType t, int rows, int cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> scale(0.002f, 0.05f);
    const int nb = cols / 32;
    size_t nbytes = 0;
    if (t == GgmlType::F32) nbytes = (size_t)rows * cols * 4;
    if (t == GgmlType::F16) nbytes = (size_t)rows * cols * 2;
    if (t == GgmlType::Q4_0) nbytes = (size_t)rows * nb * sizeof(BlockQ4_0);
    if (t == GgmlType::Q8_0) nbytes = (size_t)rows * nb * sizeof(BlockQ8_0);
    bytes.resize(nbytes);
    const float w_scale = 1.f / std::sqrt((float)cols);
    if (t == GgmlType::F32) {
      float* f = reinterpret_cast<float*>(bytes.data());
      for (size_t i = 0; i < (size_t)rows * cols; ++i) f[i] = nd(rng) * w_scale;
    } else if (t == GgmlType::F16) {
      uint16_t* h = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < (size_t)rows * cols; ++i) h[i] = f32_to_fp16(nd(rng) * w_scale);
    } else if (t == GgmlType::Q4_0) {
      std::uniform_int_distribution<int> nib(0, 255);
      BlockQ4_0* b = reinterpret_cast<BlockQ4_0*>(bytes.data());
      for (size_t i = 0; i < (size_t)rows * nb; ++i) {
        b[i].d = f32_to_fp16(scale(rng));
        for (int j = 0; j < 16; ++j) b[i].qs[j] = (uint8_t)nib(rng);
      }
    } else {
      std::uniform_int_distribution<int> q(-127, 127);
      BlockQ8_0* b = reinterpret_cast<BlockQ8_0*>(bytes.data());
      for (size_t i = 0; i < (size_t)rows * nb; ++i) {
        b[i].d = f32_to_fp16(scale(rng) / 8.f);
        for (int j = 0; j < 32; ++j) b[i].qs[j] = (int8_t)q(rng);
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

// Max |a-b| / max(|b|, floor) over a vector, for reporting.
inline double max_rel(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs((double)a[i] - b[i]) / std::max(std::fabs((double)b[i]), floor));
  }
  return m;
}

}  // namespace smolrt::test
