// The AVX2 and AVX-VNNI tile kernels of qlinear.cpp (the AVX-512 ones and the activations'
// layout: qtiles.h): a tile is two halves of 8 columns, one ymm each.
#pragma once
#include "qtiles.h"

namespace ember {

#define T256 __attribute__((target("avx2,fma,avxvnni,f16c")))

template <typename S>
T256 static inline __m256 scale8(const S* p, int64_t g, int h) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p + g * 16 + h * 8);
  else if constexpr (std::is_same_v<S, at::Half>) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + g * 16 + h * 8)));
  else return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p->sup + (g >> p->shift) * 16 + h * 8))),
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

template <int R, bool VNNI, bool U, typename S>
T256 static void w4_256(const uint8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void*) {
  const int64_t KB = a.K / 32;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const Chunk<R> c(a, row0);
  for (int h = 0; h < 2 && h * 8 < ncols; ++h) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      __m256i dot[R], pair[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int g = 0; g < 4; ++g) {
        __m256i lo, hi;
        if constexpr (U) {
          lo = _mm256_loadu_si256((const __m256i*)(qw + b * 512 + g * 64 + h * 32));
          hi = _mm256_loadu_si256((const __m256i*)(qw + b * 512 + 256 + g * 64 + h * 32));
        } else {
          if (h == 0) prefetch_ahead(qw + b * 256 + g * 64);  // half 1 finds the tile in cache
          const __m256i v = _mm256_loadu_si256((const __m256i*)(qw + b * 256 + g * 64 + h * 32));
          lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        for (int r = 0; r < R; ++r) {
          const __m256i x0 = _mm256_set1_epi32(c.codes4(8 * b + g, r));
          const __m256i x1 = _mm256_set1_epi32(c.codes4(8 * b + 4 + g, r));
          if constexpr (VNNI) {
            dot[r] = dot4<true>(dot[r], lo, x0), dot[r] = dot4<true>(dot[r], hi, x1);
          } else {  // int16 pair sums of 4-bit products stay below 2^15 for a whole block of 32
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
            pair[r] = g ? _mm256_add_epi16(pair[r], p) : p;
          }
        }
      }
      if constexpr (!VNNI)  // |sum| <= 8 * 2 * 15 * 127 = 30480: exact in int16, then widened once
        for (int r = 0; r < R; ++r) dot[r] = _mm256_madd_epi16(pair[r], _mm256_set1_epi16(1));
      const __m256 d = scale8(dw, b, h), m = scale8(mw, b, h);
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, _mm256_set1_ps(c.scale(b, r))), acc[r]);
        acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(c.smin(b, r)), acc[r]);
      }
    }
    const int n = std::min(8, ncols - h * 8);
    for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r], bias ? bias + h * 8 : nullptr, n);
  }
}

// u = w + 32 of k-group j, half h: from a 6-bit tile (W6 = 1) or a prepared byte tile (2).
template <int W6>
T256 static inline __m256i unsigned_codes(const int8_t* qw, int64_t j, int h) {
  if constexpr (W6 == 1) return w6_256((const uint8_t*)qw, j, h);
  return _mm256_loadu_si256((const __m256i*)(qw + j * 64 + h * 32));
}

// Signed 8-bit weights: |w| goes in unsigned and the activation takes w's sign (vpsignb).
// W6 = 1: 6-bit codes w + 32 (qformats.h), W6 = 2: the same as bytes in the plain layout (a
// prepared tile): u = w + 32 goes in unsigned as it is, and 32 * sum(q) comes out; with u <= 63
// two k-groups' maddubs pairs stay below 2^15, so they are summed in int16 and widened once.
template <int R, int G, bool MIN, bool VNNI, int W6, typename S>
T256 static void w8_256(const int8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void*) {
  const int64_t NG = a.K / G;
  const Chunk<R> c(a, row0);
  for (int h = 0; h < 2 && h * 8 < ncols; ++h) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < NG; ++g) {
      __m256i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int t = 0; t < G / 4; t += (W6 ? 2 : 1)) {
        const int64_t j = g * (G / 4) + t;
        if (W6 == 1 && h == 0) prefetch_w6_pair(qw, j);
        if constexpr (W6 != 0) {
          const __m256i u0 = unsigned_codes<W6>(qw, j, h), u1 = unsigned_codes<W6>(qw, j + 1, h);
          for (int r = 0; r < R; ++r) {
            const __m256i x0 = _mm256_set1_epi32(c.codes4(j, r)), x1 = _mm256_set1_epi32(c.codes4(j + 1, r));
            if constexpr (VNNI) {
              dot[r] = dot4<true>(dot4<true>(dot[r], u0, x0), u1, x1);
            } else {  // |pairs| <= 2 * 2 * 63 * 127 = 32004
              const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1));
              dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
            }
          }
        } else {
          if (h == 0) prefetch_ahead(qw + j * 64);
          const __m256i w = _mm256_loadu_si256((const __m256i*)(qw + j * 64 + h * 32));
          const __m256i u = _mm256_abs_epi8(w);
          for (int r = 0; r < R; ++r)
            dot[r] = dot4<VNNI>(dot[r], u, _mm256_sign_epi8(_mm256_set1_epi32(c.codes4(j, r)), w));
        }
      }
      const __m256 d = scale8(dw, g, h);
      for (int r = 0; r < R; ++r) {
        if constexpr (W6 != 0) {
          const int32_t sum = G == 16 ? c.sum(g, r) : c.sum(2 * g, r) + c.sum(2 * g + 1, r);
          dot[r] = _mm256_sub_epi32(dot[r], _mm256_set1_epi32(32 * sum));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, _mm256_set1_ps(c.scale(g * G / 32, r))),
                                 acc[r]);
        if (MIN) acc[r] = _mm256_fmadd_ps(scale8(mw, g, h), _mm256_set1_ps(min_term<G>(c, r, g)), acc[r]);
      }
    }
    const int n = std::min(8, ncols - h * 8);
    for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r], bias ? bias + h * 8 : nullptr, n);
  }
}

}  // namespace ember
