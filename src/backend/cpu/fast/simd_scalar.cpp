// The portable level of simd_body.h: "registers" are plain arrays of 16 lanes and every operation
// a loop (which the compiler vectorizes as far as the baseline ISA allows). The same integer dots
// and the same order of f32 operations per row as the SIMD levels, minus fused multiply-adds.
#include <cmath>
#include <cstdint>

#include "backend/cpu/fast/layout.h"
#include "quant/formats.h"

namespace smolrt::cpu::fast {
namespace {

struct V {
  static constexpr int kLanes = 16;
  static constexpr int kTok = 2;
  static constexpr int kQ8Off = 128;  // dot8 dots the stored q + 128 as unsigned bytes
  struct B {
    uint8_t v[64];
  };
  struct I {
    int32_t v[16];
  };
  struct F {
    float v[16];
  };

  template <class R, class Fn>
  static R map(Fn&& fn) {
    R r;
    for (int l = 0; l < int(sizeof r.v / sizeof r.v[0]); ++l) r.v[l] = fn(l);
    return r;
  }

  static B ld(const void* p) {
    B b;
    __builtin_memcpy(b.v, p, 64);
    return b;
  }
  static B nib_lo(B v) {
    return map<B>([&](int l) { return uint8_t(v.v[l] & 0x0f); });
  }
  static B nib_hi(B v) {
    return map<B>([&](int l) { return uint8_t(v.v[l] >> 4); });
  }
  template <int S, int M>
  static B bits(B v) {
    return map<B>([&](int l) {
      const int x = v.v[l];
      if constexpr (S >= 0) return uint8_t((x << S) & M);
      if constexpr (S < 0) return uint8_t((x >> -S) & M);
    });
  }
  static B orb(B a, B b) {
    return map<B>([&](int l) { return uint8_t(a.v[l] | b.v[l]); });
  }
  static I dot(I acc, B w, const int8_t* x) {
    return map<I>([&](int l) {
      int32_t s = acc.v[l];
      for (int i = 0; i < 4; ++i) s += int32_t(w.v[4 * l + i]) * x[i];
      return s;
    });
  }
  static I dot8(I acc, B w, const int8_t* x) { return dot(acc, w, x); }
  static I seti(int32_t v) {
    return map<I>([&](int) { return v; });
  }
  static I addi(I a, I b) {
    return map<I>([&](int l) { return a.v[l] + b.v[l]; });
  }
  static I mulli(I a, I b) {
    return map<I>([&](int l) { return a.v[l] * b.v[l]; });
  }
  static I ld_s8(const void* p) {
    return map<I>([&](int l) { return int32_t(static_cast<const int8_t*>(p)[l]); });
  }
  static F ld_u8(const void* p) {
    return map<F>([&](int l) { return float(static_cast<const uint8_t*>(p)[l]); });
  }
  static uint16_t u16(const void* p, int l) {
    uint16_t h;
    __builtin_memcpy(&h, static_cast<const uint8_t*>(p) + 2 * l, 2);
    return h;
  }
  static F ld_h(const void* p) {
    return map<F>([&](int l) { return fp16_to_f32(u16(p, l)); });
  }
  static F ld_bf(const void* p) {
    return map<F>([&](int l) { return bf16_to_f32(u16(p, l)); });
  }
  static F cvt(I v) {
    return map<F>([&](int l) { return float(v.v[l]); });
  }
  static I cvt_round(F v) {
    return map<I>([&](int l) { return int32_t(std::nearbyint(v.v[l])); });
  }
  static F pow2i(I n) {
    return map<F>([&](int l) { return bits_to_f32(uint32_t(n.v[l] + 127) << 23); });
  }
  static F setf(float v) {
    return map<F>([&](int) { return v; });
  }
  static F zerof() { return setf(0.0f); }
  static F ldf(const float* p) {
    return map<F>([&](int l) { return p[l]; });
  }
  static void stf(float* p, F v) {
    for (int l = 0; l < kLanes; ++l) p[l] = v.v[l];
  }
  static F add(F a, F b) {
    return map<F>([&](int l) { return a.v[l] + b.v[l]; });
  }
  static F sub(F a, F b) {
    return map<F>([&](int l) { return a.v[l] - b.v[l]; });
  }
  static F mul(F a, F b) {
    return map<F>([&](int l) { return a.v[l] * b.v[l]; });
  }
  static F div(F a, F b) {
    return map<F>([&](int l) { return a.v[l] / b.v[l]; });
  }
  static F fma(F a, F b, F c) {
    return map<F>([&](int l) { return a.v[l] * b.v[l] + c.v[l]; });
  }
  static F fnma(F a, F b, F c) {
    return map<F>([&](int l) { return c.v[l] - a.v[l] * b.v[l]; });
  }
  static F maxf(F a, F b) {
    return map<F>([&](int l) { return a.v[l] > b.v[l] ? a.v[l] : b.v[l]; });
  }
  static F minf(F a, F b) {
    return map<F>([&](int l) { return a.v[l] < b.v[l] ? a.v[l] : b.v[l]; });
  }
  static F absf(F a) {
    return map<F>([&](int l) { return std::fabs(a.v[l]); });
  }
  // Pairwise, as a tree: the same order for any input.
  static float hsum(F v) {
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) v.v[l] += v.v[l + w];
    return v.v[0];
  }
  static float hmax(F v) {
    float m = v.v[0];
    for (int l = 1; l < kLanes; ++l) m = v.v[l] > m ? v.v[l] : m;
    return m;
  }
};

}  // namespace
}  // namespace smolrt::cpu::fast

#include "backend/cpu/fast/simd_body.h"

namespace smolrt::cpu::fast {
const SimdTable kSimdScalar = make_table();
}  // namespace smolrt::cpu::fast
