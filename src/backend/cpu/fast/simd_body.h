// The fast CPU kernels, written once over a SIMD policy V and compiled per level by
// simd_<level>.cpp (which defines V and then includes this file). V supplies:
//   kLanes (rows per register: 16 or 8), kTok (inputs register-blocked per weight pass), kQ8Off
//   (the offset its dot8 leaves in: 128 for vpdpbusd on q + 128, 0 where it dots signed bytes),
//   B / I / F: 4 * kLanes bytes, kLanes int32, kLanes float, and the operations used below.
// Everything here has internal linkage: each level's copy stays in its own translation unit.
//
// Matmul (gemm): for one panel (16 rows) and up to kTok inputs, the int32 dot of every 32-weight
// sub-block with the input's int8 block is accumulated exactly (two chains: the low quads 0..3 and
// the high quads 4..7, which are also Q6_K's two 16-weight halves), then scaled into an f32
// accumulator per row: acc += float(dot) * (weight scale * input scale) (+ the min term). Each
// row's sequence of operations is the same for any number of inputs, so a token's result never
// depends on what it is batched with.
#pragma once

#include "backend/cpu/fast/layout.h"

namespace smolrt::cpu::fast {
namespace {

using B = typename V::B;
using I = typename V::I;
using F = typename V::F;

constexpr int kL = V::kLanes;

// How far ahead the weight stream is prefetched: decode reads every weight once per token from
// memory, and the hardware prefetcher alone left a single thread at ~85 tok/s on SmolLM2-135M
// Q4_0 where this gives ~110 (1 KiB to 4 KiB measured alike).
constexpr int kPrefetchBytes = 2048;

// --- quants of a sub-block: quad C (lo) and quad C + 4 (hi) of this pass's rows ---------------

template <int kBits, int C>
inline void quads(const uint8_t* q, B ha, B hb, B& lo, B& hi) {
  if constexpr (kBits == 8) {
    lo = V::ld(q + 64 * C);
    hi = V::ld(q + 64 * (C + 4));
  } else {
    const B v = V::ld(q + 64 * C);
    lo = V::nib_lo(v);
    hi = V::nib_hi(v);
    if constexpr (kBits == 5) {
      lo = V::orb(lo, V::template bits<4 - C, 0x10>(ha));
      hi = V::orb(hi, V::template bits<-C, 0x10>(ha));
    } else if constexpr (kBits == 6) {
      lo = V::orb(lo, V::template bits<4 - 2 * C, 0x30>(ha));
      hi = V::orb(hi, V::template bits<4 - 2 * C, 0x30>(hb));
    }
  }
}

template <int kBits, int T, int C>
inline void sub_dot_quad(const uint8_t* q, B ha, B hb, const int8_t* const* x, I* a, I* b) {
  B lo, hi;
  quads<kBits, C>(q, ha, hb, lo, hi);
  for (int t = 0; t < T; ++t) {
    if constexpr (kBits == 8) {
      a[t] = V::dot8(a[t], lo, x[t] + 4 * C);
      b[t] = V::dot8(b[t], hi, x[t] + 16 + 4 * C);
    } else {
      a[t] = V::dot(a[t], lo, x[t] + 4 * C);
      b[t] = V::dot(b[t], hi, x[t] + 16 + 4 * C);
    }
  }
}

// a[t] += dot(quads 0..3, x_t[0..16)), b[t] += dot(quads 4..7, x_t[16..32)) for one sub-block.
template <int kBits, int T>
inline void sub_dot(const uint8_t* q, const int8_t* const* x, I* a, I* b) {
  B ha{}, hb{};
  if constexpr (kBits == 5 || kBits == 6) ha = V::ld(q + 256);
  if constexpr (kBits == 6) hb = V::ld(q + 320);
  sub_dot_quad<kBits, T, 0>(q, ha, hb, x, a, b);
  sub_dot_quad<kBits, T, 1>(q, ha, hb, x, a, b);
  sub_dot_quad<kBits, T, 2>(q, ha, hb, x, a, b);
  sub_dot_quad<kBits, T, 3>(q, ha, hb, x, a, b);
}

// --- one panel pass (kLanes rows) x T inputs --------------------------------------------------

template <int kFmt, int T>
void panel(const PackedView& w, const QActs& a, int64_t p, int t0, float* out, int64_t ldo) {
  constexpr PackInfo pi = kPackInfo[kFmt];
  constexpr bool kLegacy = pi.subs == 1;
  constexpr bool kMin = kFmt == kQ4_1 || kFmt == kQ5_1;
  constexpr int kOff = kFmt == kQ4_0 ? 8 : kFmt == kQ5_0 ? 16 : kFmt == kQ8_0 ? V::kQ8Off : 0;
  const uint8_t* base = w.data + p * w.panel_bytes;
  const uint8_t* sbase = base + w.units * pi.subs * pi.sub_bytes;
  const int8_t* xr[T];
  const float* dr[T];
  const float* sr[T];
  const int32_t* hr[T];
  for (int t = 0; t < T; ++t) {
    xr[t] = a.q + (t0 + t) * a.q_stride;
    dr[t] = a.d + (t0 + t) * a.blocks;
    sr[t] = a.s + (t0 + t) * a.blocks;
    hr[t] = a.sum16 + (t0 + t) * 2 * a.blocks;
  }
  for (int h = 0; h < kPanel / kL; ++h) {
    const int64_t r0 = p * kPanel + h * kL;
    if (r0 >= w.rows) break;
    F acc[T];
    for (int t = 0; t < T; ++t) acc[t] = V::zerof();
    for (int64_t u = 0; u < w.units; ++u) {
      const uint8_t* sc = sbase + u * pi.scale_bytes;
      const uint8_t* qu = base + u * pi.subs * pi.sub_bytes + h * kL * 4;
      if (h == 0) {  // the next passes find the panel in cache
        for (int off = 0; off < pi.subs * pi.sub_bytes; off += 64)
          __builtin_prefetch(qu + kPrefetchBytes + off);
        __builtin_prefetch(sc + kPrefetchBytes * pi.scale_bytes / (pi.subs * pi.sub_bytes));
      }
      if constexpr (kLegacy) {
        I ai[T], bi[T];
        const int8_t* xb[T];
        for (int t = 0; t < T; ++t) {
          ai[t] = V::seti(-kOff * (hr[t][2 * u] + hr[t][2 * u + 1]));
          bi[t] = V::seti(0);
          xb[t] = xr[t] + u * 32;
        }
        sub_dot<pi.bits, T>(qu, xb, ai, bi);
        const F dw = V::ld_h(sc + h * kL * 2);
        for (int t = 0; t < T; ++t)
          acc[t] = V::fma(V::cvt(V::addi(ai[t], bi[t])), V::mul(dw, V::setf(dr[t][u])), acc[t]);
        if constexpr (kMin) {
          const F mw = V::ld_h(sc + 32 + h * kL * 2);
          for (int t = 0; t < T; ++t) acc[t] = V::fma(mw, V::setf(sr[t][u]), acc[t]);
        }
      } else if constexpr (kFmt == kQ6_K) {
        const F dw = V::ld_h(sc + h * kL * 2);
        for (int j = 0; j < 8; ++j) {
          const int64_t blk = u * 8 + j;
          I ai[T], bi[T];
          const int8_t* xb[T];
          for (int t = 0; t < T; ++t) {
            ai[t] = V::seti(-32 * hr[t][2 * blk]);
            bi[t] = V::seti(-32 * hr[t][2 * blk + 1]);
            xb[t] = xr[t] + blk * 32;
          }
          sub_dot<6, T>(qu + j * pi.sub_bytes, xb, ai, bi);
          const I sa = V::ld_s8(sc + 32 + 16 * (2 * j) + h * kL);
          const I sb = V::ld_s8(sc + 32 + 16 * (2 * j + 1) + h * kL);
          for (int t = 0; t < T; ++t) {
            const I tot = V::addi(V::mulli(ai[t], sa), V::mulli(bi[t], sb));
            acc[t] = V::fma(V::cvt(tot), V::mul(dw, V::setf(dr[t][blk])), acc[t]);
          }
        }
      } else {  // Q4_K, Q5_K
        const F dw = V::ld_h(sc + h * kL * 2);
        const F mw = V::ld_h(sc + 32 + h * kL * 2);
        for (int j = 0; j < 8; ++j) {
          const int64_t blk = u * 8 + j;
          I ai[T], bi[T];
          const int8_t* xb[T];
          for (int t = 0; t < T; ++t) {
            ai[t] = V::seti(0);
            bi[t] = V::seti(0);
            xb[t] = xr[t] + blk * 32;
          }
          sub_dot<pi.bits, T>(qu + j * pi.sub_bytes, xb, ai, bi);
          const F scj = V::mul(dw, V::ld_u8(sc + 64 + 16 * j + h * kL));
          const F mj = V::mul(mw, V::ld_u8(sc + 192 + 16 * j + h * kL));
          for (int t = 0; t < T; ++t) {
            acc[t] =
                V::fma(V::cvt(V::addi(ai[t], bi[t])), V::mul(scj, V::setf(dr[t][blk])), acc[t]);
            acc[t] = V::fnma(mj, V::setf(sr[t][blk]), acc[t]);
          }
        }
      }
    }
    const int64_t valid = w.rows - r0 < kL ? w.rows - r0 : kL;
    for (int t = 0; t < T; ++t) {
      float* o = out + (t0 + t) * ldo + r0;
      if (valid == kL) {
        V::stf(o, acc[t]);
      } else {
        float tmp[kL];
        V::stf(tmp, acc[t]);
        for (int64_t i = 0; i < valid; ++i) o[i] = tmp[i];
      }
    }
  }
}

// The inputs of a panel in blocks of kTok; the remainder through the smaller instantiations.
template <int kFmt, int T>
inline void panel_rest(const PackedView& w, const QActs& a, int64_t p, int t0, int rest, float* out,
                       int64_t ldo) {
  if constexpr (T > 0) {
    if (rest == T) return panel<kFmt, T>(w, a, p, t0, out, ldo);
    panel_rest<kFmt, T - 1>(w, a, p, t0, rest, out, ldo);
  }
}

template <int kFmt>
void gemm(const PackedView& w, const QActs& a, int n, int64_t p0, int64_t p1, float* out,
          int64_t ldo) {
  for (int64_t p = p0; p < p1; ++p) {
    int t0 = 0;
    for (; t0 + V::kTok <= n; t0 += V::kTok) panel<kFmt, V::kTok>(w, a, p, t0, out, ldo);
    if (t0 < n) panel_rest<kFmt, V::kTok - 1>(w, a, p, t0, n - t0, out, ldo);
  }
}

// --- float weights (F32 / F16 / BF16), any cols -------------------------------------------------

template <int kFF>
inline F ld_w(const uint8_t* row, int64_t k) {
  if constexpr (kFF == kF32) return V::ldf(reinterpret_cast<const float*>(row) + k);
  if constexpr (kFF == kF16) return V::ld_h(row + 2 * k);
  if constexpr (kFF == kBF16) return V::ld_bf(row + 2 * k);
}

// Two accumulators per input (alternate kLanes-chunks) so one input is not one latency chain.
template <int kFF, int T>
void row_float(const FloatView& w, const float* x, int64_t ldx, int t0, int64_t r, float* out,
               int64_t ldo) {
  constexpr int kEl = kFF == kF32 ? 4 : 2;
  const uint8_t* row = w.data + r * w.row_stride;
  const int64_t cols = w.cols;
  F acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = V::zerof();
  int64_t k = 0;
  for (; k + 2 * kL <= cols; k += 2 * kL) {
    const F w0 = ld_w<kFF>(row, k), w1 = ld_w<kFF>(row, k + kL);
    for (int t = 0; t < T; ++t) {
      const float* xt = x + (t0 + t) * ldx + k;
      acc[t][0] = V::fma(w0, V::ldf(xt), acc[t][0]);
      acc[t][1] = V::fma(w1, V::ldf(xt + kL), acc[t][1]);
    }
  }
  // The tail (under 2 * kLanes elements) through zero-padded copies, chunk by chunk.
  for (; k < cols; k += kL) {
    const int64_t m = cols - k < kL ? cols - k : kL;
    alignas(64) uint8_t wb[4 * kL] = {};
    __builtin_memcpy(wb, row + kEl * k, static_cast<size_t>(kEl * m));
    const F wv = ld_w<kFF>(wb, 0);
    for (int t = 0; t < T; ++t) {
      alignas(64) float xb[kL] = {};
      __builtin_memcpy(xb, x + (t0 + t) * ldx + k, static_cast<size_t>(4 * m));
      acc[t][0] = V::fma(wv, V::ldf(xb), acc[t][0]);
    }
  }
  for (int t = 0; t < T; ++t) out[(t0 + t) * ldo + r] = V::hsum(V::add(acc[t][0], acc[t][1]));
}

template <int kFF, int T>
inline void row_float_rest(const FloatView& w, const float* x, int64_t ldx, int t0, int rest,
                           int64_t r, float* out, int64_t ldo) {
  if constexpr (T > 0) {
    if (rest == T) return row_float<kFF, T>(w, x, ldx, t0, r, out, ldo);
    row_float_rest<kFF, T - 1>(w, x, ldx, t0, rest, r, out, ldo);
  }
}

template <int kFF>
void gemm_float(const FloatView& w, const float* x, int64_t ldx, int n, int64_t r0, int64_t r1,
                float* out, int64_t ldo) {
  for (int64_t r = r0; r < r1; ++r) {
    int t0 = 0;
    for (; t0 + V::kTok <= n; t0 += V::kTok) row_float<kFF, V::kTok>(w, x, ldx, t0, r, out, ldo);
    if (t0 < n) row_float_rest<kFF, V::kTok - 1>(w, x, ldx, t0, n - t0, r, out, ldo);
  }
}

// --- activations --------------------------------------------------------------------------------

// Round to nearest (ties to even) for |v| < 2^22, without libm.
inline float round_near(float v) {
  return (v + 12582912.0f) - 12582912.0f;
}

void quantize(const float* x, int64_t cols, int8_t* q, float* d, float* s, int32_t* sum16) {
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + b * 32;
    F m = V::zerof();
    for (int i = 0; i < 32; i += kL) m = V::maxf(m, V::absf(V::ldf(xb + i)));
    const float amax = V::hmax(m);
    const float db = amax / 127.0f;
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    int8_t* qb = q + b * 32;
    for (int half = 0; half < 2; ++half) {
      int32_t sum = 0;
      for (int i = 16 * half; i < 16 * half + 16; ++i) {
        const float r = round_near(xb[i] * id);
        const int v = static_cast<int>(r < -127.f ? -127.f : r > 127.f ? 127.f : r);
        qb[i] = static_cast<int8_t>(v);
        sum += v;
      }
      sum16[2 * b + half] = sum;
    }
    d[b] = db;
    s[b] = db * static_cast<float>(sum16[2 * b] + sum16[2 * b + 1]);
  }
}

// exp(x), Cephes' single-precision polynomial (about 1 ulp on the clamped range).
inline F vexp(F x) {
  x = V::minf(V::maxf(x, V::setf(-87.33654f)), V::setf(88.0f));
  const I n = V::cvt_round(V::mul(x, V::setf(1.44269504088896341f)));
  const F nf = V::cvt(n);
  F r = V::fnma(nf, V::setf(0.693359375f), x);
  r = V::fnma(nf, V::setf(-2.12194440e-4f), r);
  F p = V::setf(1.9875691500e-4f);
  p = V::fma(p, r, V::setf(1.3981999507e-3f));
  p = V::fma(p, r, V::setf(8.3334519073e-3f));
  p = V::fma(p, r, V::setf(4.1665795894e-2f));
  p = V::fma(p, r, V::setf(1.6666665459e-1f));
  p = V::fma(p, r, V::setf(5.0000001201e-1f));
  p = V::fma(p, V::mul(r, r), V::add(r, V::setf(1.0f)));
  return V::mul(p, V::pow2i(n));
}

// f(v) over n floats in kLanes chunks, the tail through a padded copy.
template <class Fn>
inline void each_chunk(float* y, const float* z, int64_t n, Fn&& f) {
  int64_t i = 0;
  for (; i + kL <= n; i += kL) V::stf(y + i, f(V::ldf(y + i), V::ldf(z + i)));
  if (i < n) {
    float yb[kL] = {}, zb[kL] = {};
    __builtin_memcpy(yb, y + i, static_cast<size_t>(4 * (n - i)));
    __builtin_memcpy(zb, z + i, static_cast<size_t>(4 * (n - i)));
    V::stf(yb, f(V::ldf(yb), V::ldf(zb)));
    __builtin_memcpy(y + i, yb, static_cast<size_t>(4 * (n - i)));
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  each_chunk(gate, up, n, [](F g, F u) {
    const F one = V::setf(1.0f);
    return V::mul(V::div(g, V::add(one, vexp(V::sub(V::zerof(), g)))), u);
  });
}

void gelu_mul(float* gate, const float* up, int64_t n) {
  each_chunk(gate, up, n, [](F g, F u) {
    const F one = V::setf(1.0f);
    const F z = V::mul(V::mul(V::setf(0.7978845608028654f), g),
                       V::fma(V::mul(V::setf(0.044715f), g), g, one));
    return V::mul(V::div(g, V::add(one, vexp(V::mul(V::setf(-2.0f), z)))), u);
  });
}

// --- attention, one query head ------------------------------------------------------------------

// Positions whose K or V row is prefetched ahead of use: the rows of a head are 4 * kv_dim bytes
// apart, a stride the hardware prefetcher does not follow across pages.
constexpr int kRowsAhead = 4;

inline float dot_f(const float* a, const float* b, int n) {
  F acc0 = V::zerof(), acc1 = V::zerof();
  int i = 0;
  for (; i + 2 * kL <= n; i += 2 * kL) {
    acc0 = V::fma(V::ldf(a + i), V::ldf(b + i), acc0);
    acc1 = V::fma(V::ldf(a + i + kL), V::ldf(b + i + kL), acc1);
  }
  if (i + kL <= n) {
    acc0 = V::fma(V::ldf(a + i), V::ldf(b + i), acc0);
    i += kL;
  }
  float s = V::hsum(V::add(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The pool offsets of positions first..n_pos-1, page by page, into rows[].
inline void position_rows(const AttnHead& h, int64_t* rows) {
  int n = 0;
  for (int i = h.first / h.page_size, t0 = i * h.page_size; t0 < h.n_pos; t0 += h.page_size, ++i) {
    const int64_t base = int64_t(h.pages[i]) * h.page_size;
    const int m = h.n_pos - t0 < h.page_size ? h.n_pos - t0 : h.page_size;
    for (int r = h.first > t0 ? h.first - t0 : 0; r < m; ++r) rows[n++] = (base + r) * h.stride;
  }
}

void attention_head(const AttnHead& h) {
  const int hd = h.head_dim, n = h.n_pos - h.first;
  float* sc = h.scores;
  int64_t* rows = h.rows;
  position_rows(h, rows);
  float mx = -3.0e38f;
  for (int i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) {
      for (int d = 0; d < hd; d += 16) __builtin_prefetch(h.k + rows[i + kRowsAhead] + d);
    }
    const float s = dot_f(h.q, h.k + rows[i], hd) * h.scale;
    sc[i] = s;
    mx = s > mx ? s : mx;
  }
  const F mv = V::setf(mx);
  F sum = V::zerof();
  int i = 0;
  for (; i + kL <= n; i += kL) {
    const F e = vexp(V::sub(V::ldf(sc + i), mv));
    V::stf(sc + i, e);
    sum = V::add(sum, e);
  }
  float total = V::hsum(sum);
  if (i < n) {
    float tb[kL] = {};
    __builtin_memcpy(tb, sc + i, static_cast<size_t>(4 * (n - i)));
    V::stf(tb, vexp(V::sub(V::ldf(tb), mv)));
    for (int j = 0; j < n - i; ++j) total += tb[j];
    __builtin_memcpy(sc + i, tb, static_cast<size_t>(4 * (n - i)));
  }
  const float inv = 1.0f / total;
  for (int j = 0; j < n; ++j) sc[j] *= inv;
  // out = sum of p_t v_t, one kLanes column chunk at a time with the positions inner (two
  // accumulators), so the sum stays in registers; a tail of columns through padded copies.
  int d = 0;
  for (; d + kL <= hd; d += kL) {
    F a0 = V::zerof(), a1 = V::zerof();
    int t = 0;
    for (; t + 2 <= n; t += 2) {
      if (d == 0 && t + kRowsAhead < n) {
        for (int e = 0; e < hd; e += 16) __builtin_prefetch(h.v + rows[t + kRowsAhead] + e);
      }
      a0 = V::fma(V::setf(sc[t]), V::ldf(h.v + rows[t] + d), a0);
      a1 = V::fma(V::setf(sc[t + 1]), V::ldf(h.v + rows[t + 1] + d), a1);
    }
    if (t < n) a0 = V::fma(V::setf(sc[t]), V::ldf(h.v + rows[t] + d), a0);
    V::stf(h.out + d, V::add(a0, a1));
  }
  for (; d < hd; ++d) {
    float o = 0.0f;
    for (int t = 0; t < n; ++t) o += sc[t] * h.v[rows[t] + d];
    h.out[d] = o;
  }
}

// --- the level's table
// ----------------------------------------------------------------------------

constexpr SimdTable make_table() {
  SimdTable t{};
  t.quantize = &quantize;
  t.gemm[kQ4_0] = &gemm<kQ4_0>;
  t.gemm[kQ4_1] = &gemm<kQ4_1>;
  t.gemm[kQ5_0] = &gemm<kQ5_0>;
  t.gemm[kQ5_1] = &gemm<kQ5_1>;
  t.gemm[kQ8_0] = &gemm<kQ8_0>;
  t.gemm[kQ4_K] = &gemm<kQ4_K>;
  t.gemm[kQ5_K] = &gemm<kQ5_K>;
  t.gemm[kQ6_K] = &gemm<kQ6_K>;
  t.gemm_float[kF32] = &gemm_float<kF32>;
  t.gemm_float[kF16] = &gemm_float<kF16>;
  t.gemm_float[kBF16] = &gemm_float<kBF16>;
  t.attention_head = &attention_head;
  t.silu_mul = &silu_mul;
  t.gelu_mul = &gelu_mul;
  return t;
}

}  // namespace
}  // namespace smolrt::cpu::fast
