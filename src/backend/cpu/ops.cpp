// CPU reference ops. Weights are read straight from the mmap'ed file and dequantized on the fly,
// one block at a time (F32/F16/BF16 32 elements through a stack buffer; Q4_0/Q4_1/Q8_0 as a fused
// block dot with the fp16 scale applied to the block's partial sum; Q5_0/Q5_1 32 and the K-quants
// 256 elements dequantized by the format's reference decoder (quant/format.h), then a plain f32
// dot). Memory cost for weights: none beyond the mapping (1 KiB of stack per thread).
#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/format.h"

namespace smolrt::cpu {

namespace {

// 32-wide dot product with 8 independent f32 accumulators so GCC can keep it in SIMD registers
// without -ffast-math (the summation order is fixed, so results are reproducible).
inline float dot32(const float* a, const float* b) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < 32; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[j + k] * b[j + k];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Elements per block of the CPU loop: the format's block, or 32 for the element formats (F32/F16/
// BF16 rows are walked 32 at a time with an element-wise tail).
template <GgmlType T>
constexpr int64_t kBlock = Format<T>::kBlockSize == 1 ? kQK : Format<T>::kBlockSize;

// A packed block of type B at byte offset `at` (rows may be unaligned: memcpy, not a cast).
template <typename B>
inline B load_block(const uint8_t* at) {
  B blk;
  std::memcpy(&blk, at, sizeof blk);
  return blk;
}

// Dequantizes block b (kBlock<T> elements) of a row into out with the format's reference decoder.
// The type is a template parameter so the per-block work has no branch on it (one dispatch per
// row range).
template <GgmlType T>
inline void dequant_block(const uint8_t* row, int64_t b, float* out) {
  using F = Format<T>;
  using B = typename F::Block;
  constexpr int64_t kPer = kBlock<T> / F::kBlockSize;  // format blocks per loop block
  for (int64_t j = 0; j < kPer; ++j)
    F::dequantize(load_block<B>(row + (b * kPer + j) * sizeof(B)), out + j * F::kBlockSize);
}

// Element i of a row of an element format (rows of f32/f16/bf16 may have cols not a multiple of
// 32: the tail is walked element-wise). Block formats have whole blocks only (check_computable).
template <GgmlType T>
inline float elem(const uint8_t* row, int64_t i) {
  using F = Format<T>;
  if constexpr (F::kBlockSize == 1) {
    float v;
    F::dequantize(load_block<typename F::Block>(row + i * sizeof(typename F::Block)), &v);
    return v;
  } else {
    fail("internal: a ", F::kName, " row with a partial block");
  }
}

inline const uint8_t* row_ptr(const TensorView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride();
}

// dot(block b of a row, x[0..32)) for the quantized types, with the scale factored out of the
// sum: d * sum(q * x) (+ m * sum(x) for Q4_1). Same f32 math as dequantize-then-dot up to
// rounding order, and faster because the int->float nibble unpack and the multiply-add
// vectorize together (8 independent lanes, no -ffast-math needed).
template <GgmlType T>
inline float block_dot(const uint8_t* row, int64_t b, const float* x) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  auto lanes = [&] {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  };
  if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1) {
    constexpr size_t kBytes = T == GgmlType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ4_1);
    constexpr int kOff = T == GgmlType::Q4_0 ? 8 : 0;  // Q4_0 nibbles are offset by 8
    const uint8_t* p = row + b * kBytes;
    const uint8_t* qs = p + kBytes - 16;
    for (int j = 0; j < 16; j += 8) {
      for (int k = 0; k < 8; ++k) acc[k] += static_cast<float>((qs[j + k] & 15) - kOff) * x[j + k];
    }
    for (int j = 0; j < 16; j += 8) {
      for (int k = 0; k < 8; ++k) {
        acc[k] += static_cast<float>((qs[j + k] >> 4) - kOff) * x[16 + j + k];
      }
    }
    uint16_t dh;
    std::memcpy(&dh, p, 2);
    if constexpr (T == GgmlType::Q4_0) {
      return lanes() * fp16_to_f32(dh);
    } else {
      uint16_t mh;
      std::memcpy(&mh, p + 2, 2);
      const float qx = lanes();
      for (int k = 0; k < 8; ++k) acc[k] = 0;
      for (int j = 0; j < 32; j += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += x[j + k];
      }
      return qx * fp16_to_f32(dh) + lanes() * fp16_to_f32(mh);
    }
  } else {
    static_assert(T == GgmlType::Q8_0);
    const uint8_t* p = row + b * sizeof(BlockQ8_0);
    const int8_t* qs = reinterpret_cast<const int8_t*>(p + 2);
    for (int j = 0; j < 32; j += 8) {
      for (int k = 0; k < 8; ++k) acc[k] += static_cast<float>(qs[j + k]) * x[j + k];
    }
    uint16_t dh;
    std::memcpy(&dh, p, 2);
    return lanes() * fp16_to_f32(dh);
  }
}

// out[j * rows + r] = dot(W[r,:], x_j) for the n vectors x_j = x + j * cols, r in [r0, r1), or
// with x == nullptr: out = row r0 dequantized. Q4_0/Q4_1/Q8_0 use block_dot; the other types
// dequantize a block, then a plain f32 dot. The x_j loop is inside the row loop so a weight row is
// read from memory once for all of them (still hot in L1 for x_1..); each dot runs exactly as
// with n = 1.
template <GgmlType T>
void rows_t(float* out, const TensorView& w, const float* x, int n, int64_t r0, int64_t r1) {
  constexpr int64_t kB = kBlock<T>;
  // Locals: out's stores could alias w's fields as far as the compiler knows.
  const int64_t cols = w.cols, rows = w.rows, nb = cols / kB;
  float tmp[kB];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = row_ptr(w, r);
    if (!x) {
      for (int64_t b = 0; b < nb; ++b) dequant_block<T>(row, b, out + b * kB);
      for (int64_t i = nb * kB; i < w.cols; ++i) out[i] = elem<T>(row, i);
      return;
    }
    for (int j = 0; j < n; ++j) {
      const float* xj = x + j * cols;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q8_0) {
          acc += block_dot<T>(row, b, xj + b * kB);
        } else {
          dequant_block<T>(row, b, tmp);
          for (int64_t k = 0; k < kB; k += 32) acc += dot32(tmp + k, xj + b * kB + k);
        }
      }
      for (int64_t i = nb * kB; i < cols; ++i) acc += elem<T>(row, i) * xj[i];
      out[j * rows + r] = acc;
    }
  }
}

// The one place a runtime type becomes a template parameter.
void dispatch(float* out, const TensorView& w, const float* x, int n, int64_t r0, int64_t r1) {
  const bool known =
      with_format(w.type, [&](auto f) { rows_t<decltype(f)::kType>(out, w, x, n, r0, r1); });
  if (!known) fail("internal: no CPU kernel for type ", type_name(w.type));
}

}  // namespace

void check_computable(const TensorView& w) {
  const TypeInfo* ti = type_info(w.type);
  if (!ti || !ti->computable) {
    fail("tensor '", w.name, "' has type ", type_name(w.type),
         " which the CPU backend cannot compute; use one of ", format_names(true),
         " (requantize with `smolrt quantize`)");
  }
  if (w.cols % ti->block_size != 0) {
    fail("tensor '", w.name, "' has ", w.cols, " columns, not a multiple of the ", ti->name,
         " block size ", ti->block_size);
  }
}

void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void dequantize(const TensorView& w, int64_t r, float* out) {
  check_computable(w);
  if (r < 0 || r >= w.rows)
    fail("row ", r, " of tensor '", w.name, "' is out of range (", w.rows, " rows)");
  dispatch(out, w, nullptr, 1, r, r + 1);
}

void gemv_rows(float* out, const TensorView& w, const float* x, int64_t r0, int64_t r1) {
  check_computable(w);
  dispatch(out, w, x, 1, r0, r1);
}

void gemv(float* out, const TensorView& w, const float* x, int n_threads) {
  gemm(out, w, x, 1, n_threads);
}

void gemm(float* out, const TensorView& w, const float* x, int n, int n_threads) {
  check_computable(w);
  ThreadPool& pool = shared_thread_pool(n_threads);
  // Small matrices are not worth waking the workers for (a wake-up costs a few microseconds).
  const int64_t work = w.rows * w.cols * n;
  if (pool.size() == 1 || work < (1 << 15)) {
    dispatch(out, w, x, n, 0, w.rows);
    return;
  }
  // 4 chunks per thread: dynamic hand-out evens out threads slowed by other load on the host.
  const int n_chunks = static_cast<int>(std::min<int64_t>(w.rows, int64_t{pool.size()} * 4));
  pool.parallel_for(n_chunks, [&](int c) {
    const int64_t r0 = w.rows * c / n_chunks;
    const int64_t r1 = w.rows * (c + 1) / n_chunks;
    dispatch(out, w, x, n, r0, r1);
  });
}

void embed(float* out, const TensorView& embd, int token) {
  if (token < 0 || token >= embd.rows) {
    fail("token id ", token, " is out of range for '", embd.name, "' (", embd.rows, " rows)");
  }
  dequantize(embd, token, out);
}

void rope(float* v, int n_heads, int head_dim, int rope_dim, int pos, float base) {
  rope_ext(v, n_heads, head_dim, rope_dim, pos, base, false, nullptr);
}

namespace {

// cos and sin of RoPE pair i's angle pos * base^(-2i/rope_dim) / freq_factors[i].
void pair_angle(int i, int rope_dim, int pos, float base, const float* freq_factors, float& c,
                float& s) {
  // Angles in double: the oracle should not lose precision at large positions.
  double theta = pos * std::pow(static_cast<double>(base), -2.0 * i / rope_dim);
  if (freq_factors) theta /= static_cast<double>(freq_factors[i]);
  c = static_cast<float>(std::cos(theta));
  s = static_cast<float>(std::sin(theta));
}

// Rotates pair (i0, i1) of each of n_heads heads by the angle with cosine c and sine s.
void rotate_pair(float* v, int n_heads, int head_dim, int i0, int i1, float c, float s) {
  for (int h = 0; h < n_heads; ++h) {
    float* p = v + static_cast<size_t>(h) * head_dim;
    const float a = p[i0], b = p[i1];
    p[i0] = a * c - b * s;
    p[i1] = a * s + b * c;
  }
}

}  // namespace

void rope_ext(float* v, int n_heads, int head_dim, int rope_dim, int pos, float base, bool neox,
              const float* freq_factors) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    float c, s;
    pair_angle(i, rope_dim, pos, base, freq_factors, c, s);
    rotate_pair(v, n_heads, head_dim, neox ? i : 2 * i, neox ? i + half : 2 * i + 1, c, s);
  }
}

void rope_angles(float* cs, int rope_dim, int pos, float base, const float* freq_factors) {
  for (int i = 0; i < rope_dim / 2; ++i)
    pair_angle(i, rope_dim, pos, base, freq_factors, cs[2 * i], cs[2 * i + 1]);
}

void rope_apply(float* v, int n_heads, int head_dim, int rope_dim, bool neox, const float* cs) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i)
    rotate_pair(v, n_heads, head_dim, neox ? i : 2 * i, neox ? i + half : 2 * i + 1, cs[2 * i],
                cs[2 * i + 1]);
}

void head_rmsnorm(float* v, int n_heads, int head_dim, const float* w, float eps) {
  for (int h = 0; h < n_heads; ++h) {
    float* p = v + static_cast<size_t>(h) * head_dim;
    rmsnorm(p, p, w, head_dim, eps);
  }
}

void attention_paged(float* out, const float* q, const float* k_pool, const float* v_pool,
                     const int* pages, int page_size, int n_pos, int n_heads, int n_kv_heads,
                     int head_dim, float* scratch, int first, float scale) {
  const int group = n_heads / n_kv_heads;
  const int kv_dim = n_kv_heads * head_dim;
  if (scale == 0.f) scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (first < 0 || first >= n_pos) {
    fail("internal: attention over keys ", first, "..", n_pos - 1, " is empty");
  }
  // Visits positions first..n_pos-1 in order with the offset of their row: page by page, so the
  // summation order (and every result bit) is that of a contiguous cache, and the rows of one page
  // are read sequentially. Pages wholly before `first` are never looked up.
  auto each_row = [&](auto&& fn) {
    for (int i = first / page_size, t0 = i * page_size; t0 < n_pos; t0 += page_size, ++i) {
      const size_t base = static_cast<size_t>(pages[i]) * page_size * kv_dim;
      const int n = std::min(page_size, n_pos - t0);
      for (int r = std::max(0, first - t0); r < n; ++r) {
        fn(t0 + r, base + static_cast<size_t>(r) * kv_dim);
      }
    }
  };
  for (int h = 0; h < n_heads; ++h) {
    const float* qh = q + static_cast<size_t>(h) * head_dim;
    const int kvh = h / group;
    float mx = -INFINITY;
    each_row([&](int t, size_t row) {
      const float* kt = k_pool + row + kvh * head_dim;
      float s = 0.0f;
      for (int d = 0; d < head_dim; ++d) s += qh[d] * kt[d];
      s *= scale;
      scratch[t] = s;
      mx = std::max(mx, s);
    });
    float sum = 0.0f;
    for (int t = first; t < n_pos; ++t) {
      scratch[t] = std::exp(scratch[t] - mx);
      sum += scratch[t];
    }
    const float inv = 1.0f / sum;
    float* oh = out + static_cast<size_t>(h) * head_dim;
    for (int d = 0; d < head_dim; ++d) oh[d] = 0.0f;
    each_row([&](int t, size_t row) {
      const float p = scratch[t] * inv;
      const float* vt = v_pool + row + kvh * head_dim;
      for (int d = 0; d < head_dim; ++d) oh[d] += p * vt[d];
    });
  }
}

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      int n_pos, int n_heads, int n_kv_heads, int head_dim, float* scratch) {
  const int whole = 0;  // one page holding every position
  attention_paged(out, q, k_cache, v_cache, &whole, std::max(n_pos, 1), n_pos, n_heads, n_kv_heads,
                  head_dim, scratch);
}

void qkv_finish(float* q, float* k, float* v, const QkvFinishShape& s, const float* bq,
                const float* bk, const float* bv, const float* q_norm, const float* k_norm,
                const float* cs) {
  const int q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
  auto add = [](float* y, const float* b, int n) {
    if (b)
      for (int i = 0; i < n; ++i) y[i] += b[i];
  };
  add(q, bq, q_dim);
  add(k, bk, kv_dim);
  add(v, bv, kv_dim);
  if (q_norm) head_rmsnorm(q, s.n_heads, s.head_dim, q_norm, s.eps);
  if (k_norm) head_rmsnorm(k, s.n_kv_heads, s.head_dim, k_norm, s.eps);
  rope_apply(q, s.n_heads, s.head_dim, s.rope_dim, s.neox, cs);
  rope_apply(k, s.n_kv_heads, s.head_dim, s.rope_dim, s.neox, cs);
}

std::span<const float> mask_logits(std::span<const float> logits, std::span<const uint32_t> allowed,
                                   std::vector<float>& buf) {
  if (allowed.empty()) return logits;
  buf.assign(logits.begin(), logits.end());
  for (size_t t = 0; t < buf.size(); ++t)
    if (!(allowed[t / 32] >> (t % 32) & 1u)) buf[t] = -INFINITY;
  return buf;
}

void silu_mul(float* out, const float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gelu_tanh_mul(float* out, const float* gate, const float* up, int n) {
  // 0.5 (1 + tanh(z)) == 1 / (1 + exp(-2z)): the same function without the cancellation of
  // 1 + tanh(z) for z << 0 (which loses ~1e-5 relative at x = -3 in f32); exp overflowing to inf
  // for very negative x gives -0, never NaN.
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    const float z = kSqrt2OverPi * g * (1.0f + 0.044715f * g * g);
    out[i] = g / (1.0f + std::exp(-2.0f * z)) * up[i];
  }
}

int argmax(const float* x, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

}  // namespace smolrt::cpu
