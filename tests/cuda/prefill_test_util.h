// Helpers for the prefill kernel tests (GPU presence: cuda_test_util.h): device buffers, random
// quantized weights and double-precision reference math (independent of src/backend/cpu).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "cuda_test_util.h"  // REQUIRE_GPU
#include "quant/formats.h"

namespace smolrt::test {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, sizeof(T) * (n ? n : 1))); }
  DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& h) {
    CUDA_CHECK(cudaMemcpy(p, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { CUDA_CHECK(cudaMemset(p, 0xff, sizeof(T) * n)); }  // NaN for float
};

// A non-default stream, so kernels launch with programmatic dependent launch as in production.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Random raw blocks: every nibble / int8 value appears; scales ~ +-[0.5, 2] * scale.
inline std::vector<uint8_t> random_q4_0(int64_t rows, int64_t cols, uint32_t seed,
                                        float scale = 0.02f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  const int64_t nb = rows * cols / 32;
  std::vector<uint8_t> out(nb * sizeof(BlockQ4_0));
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_0 blk;
    blk.d = f32_to_fp16(ud(rng) * scale * ((rng() & 1) ? 1.f : -1.f));
    for (auto& q : blk.qs) q = (uint8_t)(rng() & 0xff);
    std::memcpy(out.data() + b * sizeof(BlockQ4_0), &blk, sizeof blk);
  }
  return out;
}

inline std::vector<uint8_t> random_q8_0(int64_t rows, int64_t cols, uint32_t seed,
                                        float scale = 0.002f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  const int64_t nb = rows * cols / 32;
  std::vector<uint8_t> out(nb * sizeof(BlockQ8_0));
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ8_0 blk;
    blk.d = f32_to_fp16(ud(rng) * scale);
    for (auto& q : blk.qs) q = (int8_t)(rng() & 0xff);
    std::memcpy(out.data() + b * sizeof(BlockQ8_0), &blk, sizeof blk);
  }
  return out;
}

// Dequantized [rows][cols] in double.
inline std::vector<double> dequant(const std::vector<uint8_t>& raw, GgmlType t, int64_t rows,
                                   int64_t cols) {
  std::vector<double> w(rows * cols);
  float tmp[32];
  const int bs = t == GgmlType::Q4_0 ? (int)sizeof(BlockQ4_0) : (int)sizeof(BlockQ8_0);
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    if (t == GgmlType::Q4_0) {
      BlockQ4_0 blk;
      std::memcpy(&blk, raw.data() + b * bs, sizeof blk);
      dequant_block_q4_0(blk, tmp);
    } else {
      BlockQ8_0 blk;
      std::memcpy(&blk, raw.data() + b * bs, sizeof blk);
      dequant_block_q8_0(blk, tmp);
    }
    for (int j = 0; j < 32; ++j) w[b * 32 + j] = tmp[j];
  }
  return w;
}

// ||a - ref|| / ||ref||; NaN anywhere in a -> +inf.
inline double rel_l2(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// ||g - r|| / ||r|| over n floats (0 when r is all zeros and g matches).
inline double rel_l2(const float* g, const float* r, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += ((double)g[i] - r[i]) * ((double)g[i] - r[i]);
    den += (double)r[i] * r[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline void rmsnorm_ref(const float* x, const float* w, int n, double eps, double* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const double r = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * r * (w ? w[i] : 1.0);
}

inline void rope_ref(double* v, int n_heads, int head_dim, int rope_dim, int pos, double base) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double th = pos * std::pow(base, -2.0 * i / rope_dim);
      double* p = v + h * head_dim + 2 * i;
      const double a = p[0], b = p[1];
      p[0] = a * std::cos(th) - b * std::sin(th);
      p[1] = a * std::sin(th) + b * std::cos(th);
    }
}

}  // namespace smolrt::test
