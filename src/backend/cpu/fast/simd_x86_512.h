// The AVX-512 policy for simd_body.h: 16 rows per zmm register. Built twice: simd_avx512.cpp
// (F/BW/VL/DQ: the u8 x s8 quad dot as vpmaddubsw + vpmaddwd) and simd_avx512vnni.cpp (+ VNNI:
// one vpdpbusd). Include only from those files: it needs their -m flags.
#pragma once

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm*_undefined_* placeholders
// (GCC bug 105593, fixed in 13); silenced for the header's lines only. Clang has neither the bug
// nor the -Wmaybe-uninitialized group.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "backend/cpu/fast/layout.h"

namespace smolrt::cpu::fast {
namespace {

struct V {
  static constexpr int kLanes = 16;
  static constexpr int kTok = 8;
#if defined(__AVX512VNNI__)
  static constexpr int kQ8Off = 128;  // dot8 dots the stored q + 128 as unsigned bytes
#else
  static constexpr int kQ8Off = 0;
#endif
  using B = __m512i;
  using I = __m512i;
  using F = __m512;

  static B ld(const void* p) {
    return _mm512_loadu_si512(p);
  }
  static B nib_lo(B v) {
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
  }
  static B nib_hi(B v) {
    return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
  }
  // Per byte (v << S, or >> -S) & M: 16-bit shifts, correct for layout.h's bit planes because the
  // mask keeps only bits that stayed inside their byte.
  template <int S, int M>
  static B bits(B v) {
    if constexpr (S > 0) v = _mm512_slli_epi16(v, S);
    if constexpr (S < 0) v = _mm512_srli_epi16(v, -S);
    return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(M)));
  }
  static B orb(B a, B b) {
    return _mm512_or_si512(a, b);
  }
  // acc[l] += sum over i < 4 of w[4 l + i] (unsigned) * x[i] (signed).
  static I dot(I acc, B w, const int8_t* x) {
    int32_t xv;
    __builtin_memcpy(&xv, x, 4);
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(xv));
#else
    // |w| <= 63 and |x| <= 127: the pair sums stay below vpmaddubsw's int16 saturation.
    const __m512i p = _mm512_maddubs_epi16(w, _mm512_set1_epi32(xv));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
#endif
  }
  // The same for Q8_0 (w = q + 128): without VNNI, the signed q through |q| and x * sign(q), since
  // 255 * 127 * 2 would saturate vpmaddubsw.
  static I dot8(I acc, B w, const int8_t* x) {
#if defined(__AVX512VNNI__)
    return dot(acc, w, x);
#else
    int32_t xv;
    __builtin_memcpy(&xv, x, 4);
    const __m512i q = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
    const __m512i xs = _mm512_set1_epi32(xv);
    const __m512i sx = _mm512_mask_sub_epi8(xs, _mm512_movepi8_mask(q), _mm512_setzero_si512(), xs);
    const __m512i p = _mm512_maddubs_epi16(_mm512_abs_epi8(q), sx);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
#endif
  }
  static I seti(int32_t v) {
    return _mm512_set1_epi32(v);
  }
  static I addi(I a, I b) {
    return _mm512_add_epi32(a, b);
  }
  static I mulli(I a, I b) {
    return _mm512_mullo_epi32(a, b);
  }
  static I ld_s8(const void* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
  }
  static F ld_u8(const void* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static F ld_h(const void* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
  static F ld_bf(const void* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static F cvt(I v) {
    return _mm512_cvtepi32_ps(v);
  }
  static I cvt_round(F v) {
    return _mm512_cvtps_epi32(v);
  }
  static F pow2i(I n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  }
  static F setf(float v) {
    return _mm512_set1_ps(v);
  }
  static F zerof() {
    return _mm512_setzero_ps();
  }
  static F ldf(const float* p) {
    return _mm512_loadu_ps(p);
  }
  static void stf(float* p, F v) {
    _mm512_storeu_ps(p, v);
  }
  static F add(F a, F b) {
    return _mm512_add_ps(a, b);
  }
  static F sub(F a, F b) {
    return _mm512_sub_ps(a, b);
  }
  static F mul(F a, F b) {
    return _mm512_mul_ps(a, b);
  }
  static F div(F a, F b) {
    return _mm512_div_ps(a, b);
  }
  static F fma(F a, F b, F c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  static F fnma(F a, F b, F c) {
    return _mm512_fnmadd_ps(a, b, c);
  }
  static F maxf(F a, F b) {
    return _mm512_max_ps(a, b);
  }
  static F minf(F a, F b) {
    return _mm512_min_ps(a, b);
  }
  static F absf(F a) {
    return _mm512_abs_ps(a);
  }
  static float hsum(F v) {
    return _mm512_reduce_add_ps(v);
  }
  static float hmax(F v) {
    return _mm512_reduce_max_ps(v);
  }
};

}  // namespace
}  // namespace smolrt::cpu::fast

#include "backend/cpu/fast/simd_body.h"
