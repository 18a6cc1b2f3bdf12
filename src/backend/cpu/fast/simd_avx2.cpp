// AVX2 + FMA + F16C kernels: 8 rows per ymm register, the u8 x s8 quad dot as vpmaddubsw +
// vpmaddwd. Compiled with this level's -m flags (CMakeLists.txt), called only after runtime
// detection (isa.cpp).
#include <immintrin.h>

#include "backend/cpu/fast/layout.h"

namespace smolrt::cpu::fast {
namespace {

struct V {
  static constexpr int kLanes = 8;
  static constexpr int kTok = 4;
  static constexpr int kQ8Off = 0;  // dot8 dots the signed q
  using B = __m256i;
  using I = __m256i;
  using F = __m256;

  static B ld(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static B nib_lo(B v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
  static B nib_hi(B v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }
  // Per byte (v << S, or >> -S) & M (see simd_x86_512.h).
  template <int S, int M>
  static B bits(B v) {
    if constexpr (S > 0) v = _mm256_slli_epi16(v, S);
    if constexpr (S < 0) v = _mm256_srli_epi16(v, -S);
    return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(M)));
  }
  static B orb(B a, B b) { return _mm256_or_si256(a, b); }
  // |w| <= 63 and |x| <= 127: the pair sums stay below vpmaddubsw's int16 saturation.
  static I dot(I acc, B w, const int8_t* x) {
    int32_t xv;
    __builtin_memcpy(&xv, x, 4);
    const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(xv));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  // Q8_0 (w = q + 128): |q| times x * sign(q).
  static I dot8(I acc, B w, const int8_t* x) {
    int32_t xv;
    __builtin_memcpy(&xv, x, 4);
    const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i p =
        _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(_mm256_set1_epi32(xv), q));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  static I seti(int32_t v) { return _mm256_set1_epi32(v); }
  static I addi(I a, I b) { return _mm256_add_epi32(a, b); }
  static I mulli(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I ld_s8(const void* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
  static F ld_u8(const void* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static F ld_h(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static F ld_bf(const void* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static I cvt_round(F v) { return _mm256_cvtps_epi32(v); }
  static F pow2i(I n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  }
  static F setf(float v) { return _mm256_set1_ps(v); }
  static F zerof() { return _mm256_setzero_ps(); }
  static F ldf(const float* p) { return _mm256_loadu_ps(p); }
  static void stf(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F maxf(F a, F b) { return _mm256_max_ps(a, b); }
  static F minf(F a, F b) { return _mm256_min_ps(a, b); }
  static F absf(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static __m128 half_sum(F v) {
    return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  }
  static float hsum(F v) {
    __m128 s = half_sum(v);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace
}  // namespace smolrt::cpu::fast

#include "backend/cpu/fast/simd_body.h"

namespace smolrt::cpu::fast {
const SimdTable kSimdAvx2 = make_table();
}  // namespace smolrt::cpu::fast
