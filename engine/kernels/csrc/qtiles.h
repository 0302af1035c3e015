// The tile kernels of qlinear.cpp: one tile of 16 output columns against R rows of int8
// activations, per weight format and code path (the maths and layouts: qlinear.cpp's header).
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstring>
#include <type_traits>

namespace ember {

// Quantized activations of M rows: q [M, K], s and sm = s * sum(q) per 32, sums per 16.
struct Acts {
  const int8_t* q;
  const float* s;
  const float* sm;
  const int32_t* sum16;
  int64_t K;
};

// K-quant scales of one tile: group g's = sup[g / per] (float16, per super-block) * code[g].
struct KScales {
  const at::Half* sup;
  const int8_t* code;
  int64_t per;  // groups per super-block
};

static inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// s * sum(q) over group g of a row: the factor of the min m in y (per 32 precomputed, per 16 here).
template <int G>
static inline float min_term(const Acts& a, int64_t row, int64_t g) {
  if constexpr (G == 32) return a.sm[row * (a.K / 32) + g];
  return a.s[row * (a.K / 32) + g / 2] * (float)a.sum16[row * (a.K / 16) + g];
}

// ---- AVX-512 VNNI: one zmm holds the 16 columns of a tile ----------------------------------

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))

// Group g's scales (or mins) of the 16 columns as float32: stored float32, float16 where that is
// exact, or (K-quants) a float16 super-block scale times an 8-bit code, ggml's own d * sc, which
// rounds once, so the product has the bits a float32 copy of it would.
template <typename S>
T512 static inline __m512 scale16(const S* p, int64_t g) {
  if constexpr (std::is_same_v<S, float>) return _mm512_loadu_ps(p + g * 16);
  else if constexpr (std::is_same_v<S, at::Half>) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + g * 16)));
  else return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p->sup + g / p->per * 16))),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p->code + g * 16)))));
}

T512 static inline void store16(float* y, __m512 v, const float* bias, int ncols) {
  if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps((__mmask16)((1u << ncols) - 1), bias));
  _mm512_mask_storeu_ps(y, (__mmask16)((1u << ncols) - 1), v);
}

template <int R, typename S>
T512 static void w4_512(const uint8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols) {
  const int64_t KB = a.K / 32;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      const __m512i v = _mm512_loadu_si512(qw + b * 256 + g * 64);
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* aq = a.q + (row0 + r) * a.K + b * 32;
        dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(load4(aq + 4 * g)));
        dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(load4(aq + 16 + 4 * g)));
      }
    }
    const __m512 d = scale16(dw, b), m = scale16(mw, b);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (row0 + r) * KB + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, _mm512_set1_ps(a.s[i])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sm[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store16(y + (row0 + r) * ldy, acc[r], bias, ncols);
}

// 8-bit weights are signed; vpdpbusd wants one unsigned side, so w + 128 goes in (xor 0x80)
// and 128 * sum(q) comes back out of the exact int32 sum.
template <int R, int G, bool MIN, typename S>
T512 static void w8_512(const int8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols) {
  const int64_t NG = a.K / G, KB = a.K / 32;
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < NG; ++g) {
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
    for (int t = 0; t < G / 4; ++t) {
      const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(qw + (g * (G / 4) + t) * 64), flip);
      for (int r = 0; r < R; ++r)
        dot[r] = _mm512_dpbusd_epi32(dot[r], u, _mm512_set1_epi32(load4(a.q + (row0 + r) * a.K + g * G + 4 * t)));
    }
    const __m512 d = scale16(dw, g);
    for (int r = 0; r < R; ++r) {
      const int32_t* s16 = a.sum16 + (row0 + r) * (a.K / 16) + g * (G / 16);
      const int32_t sum = G == 16 ? s16[0] : s16[0] + s16[1];
      const __m512i exact = _mm512_sub_epi32(dot[r], _mm512_set1_epi32(128 * sum));
      const int64_t i = (row0 + r) * KB + g * G / 32;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, _mm512_set1_ps(a.s[i])), acc[r]);
      if (MIN) acc[r] = _mm512_fmadd_ps(scale16(mw, g), _mm512_set1_ps(min_term<G>(a, row0 + r, g)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store16(y + (row0 + r) * ldy, acc[r], bias, ncols);
}

// ---- AVX2 and AVX-VNNI: a tile is two halves of 8 columns, one ymm each --------------------

#define T256 __attribute__((target("avx2,fma,avxvnni,f16c")))

template <typename S>
T256 static inline __m256 scale8(const S* p, int64_t g, int h) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p + g * 16 + h * 8);
  else if constexpr (std::is_same_v<S, at::Half>) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + g * 16 + h * 8)));
  else return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p->sup + g / p->per * 16 + h * 8))),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p->code + g * 16 + h * 8)))));
}

// sum of four u8*s8 products per int32 lane, added to acc (exact here: |u| <= 128, |s| <= 127).
template <bool VNNI>
T256 static inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
  if constexpr (VNNI) return _mm256_dpbusd_avx_epi32(acc, u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

T256 static inline void store8(float* y, __m256 v, const float* bias, int ncols) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  for (int c = 0; c < ncols; ++c) y[c] = bias ? tmp[c] + bias[c] : tmp[c];
}

template <int R, bool VNNI, typename S>
T256 static void w4_256(const uint8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols) {
  const int64_t KB = a.K / 32;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2 && h * 8 < ncols; ++h) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      __m256i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int g = 0; g < 4; ++g) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qw + b * 256 + g * 64 + h * 32));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* aq = a.q + (row0 + r) * a.K + b * 32;
          dot[r] = dot4<VNNI>(dot[r], lo, _mm256_set1_epi32(load4(aq + 4 * g)));
          dot[r] = dot4<VNNI>(dot[r], hi, _mm256_set1_epi32(load4(aq + 16 + 4 * g)));
        }
      }
      const __m256 d = scale8(dw, b, h), m = scale8(mw, b, h);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (row0 + r) * KB + b;
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, _mm256_set1_ps(a.s[i])), acc[r]);
        acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.sm[i]), acc[r]);
      }
    }
    const int n = std::min(8, ncols - h * 8);
    for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r], bias ? bias + h * 8 : nullptr, n);
  }
}

// Signed 8-bit weights: |w| goes in unsigned and the activation takes w's sign (vpsignb).
template <int R, int G, bool MIN, bool VNNI, typename S>
T256 static void w8_256(const int8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols) {
  const int64_t NG = a.K / G, KB = a.K / 32;
  for (int h = 0; h < 2 && h * 8 < ncols; ++h) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < NG; ++g) {
      __m256i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int t = 0; t < G / 4; ++t) {
        const __m256i w = _mm256_loadu_si256((const __m256i*)(qw + (g * (G / 4) + t) * 64 + h * 32));
        const __m256i u = _mm256_abs_epi8(w);
        for (int r = 0; r < R; ++r) {
          const __m256i x = _mm256_set1_epi32(load4(a.q + (row0 + r) * a.K + g * G + 4 * t));
          dot[r] = dot4<VNNI>(dot[r], u, _mm256_sign_epi8(x, w));
        }
      }
      const __m256 d = scale8(dw, g, h);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (row0 + r) * KB + g * G / 32;
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, _mm256_set1_ps(a.s[i])), acc[r]);
        if (MIN)
          acc[r] = _mm256_fmadd_ps(scale8(mw, g, h), _mm256_set1_ps(min_term<G>(a, row0 + r, g)), acc[r]);
      }
    }
    const int n = std::min(8, ncols - h * 8);
    for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r], bias ? bias + h * 8 : nullptr, n);
  }
}

}  // namespace ember
