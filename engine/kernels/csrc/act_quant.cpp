// Activations to int8 per row and per block of 32 (the left side of qlinear.cpp's products):
//     s = max|x| / 127,  q = round(x / s) ties to even,  and per block s and s * sum(q) in
// float16 precision, per 16 values sum(q).
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ember.h"

namespace ember {

#define T2 __attribute__((target("avx2,fma,f16c")))

T2 static inline int32_t hsum8i(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}

// One block of 32: every value's code in one pass of 8-wide ops. max is exact in any order and
// the rounding is ties-to-even, as nearbyint's, so the codes are the scalar definition's.
T2 static void quantize_block(const float* xb, int8_t* q, float* s, float* sm, int32_t* sum16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float d = _mm_cvtss_f32(m4) / 127.f, id = d != 0.f && std::isfinite(1.f / d) ? 1.f / d : 0.f;
  __m256i c[4];
  for (int i = 0; i < 4; ++i)
    c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const int32_t lo = hsum8i(_mm256_add_epi32(c[0], c[1])), hi = hsum8i(_mm256_add_epi32(c[2], c[3]));
  // packs work per 128-bit lane; the permute puts the 32 codes back in order
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  // The scale and the min's factor are rounded to float16, as llama.cpp's q8_0/q8_1 blocks
  // store them: 2^-12 of relative error, far below the codes' 1/254, and logits that agree
  // with llama.cpp's to its summation order.
  *s = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
  *sm = _cvtsh_ss(_cvtss_sh(d * (float)(lo + hi), _MM_FROUND_TO_NEAREST_INT));
  sum16[0] = lo;
  sum16[1] = hi;
}

void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* s, float* sm, int32_t* sum16) {
  at::parallel_for(0, M * (K / 32), 2048, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) quantize_block(x + i * 32, q + i * 32, s + i, sm + i, sum16 + 2 * i);
  });
}

// Rows [row0, row0 + R) of q, s, sm and sum16 into the chunk layout of qtiles.h's Acts: code
// k of row r at (k / 4 * R + r) * 4 + k % 4 from row0 * K, per-block values at b * R + r.
void interleave_rows(const int8_t* q, const float* s, const float* sm, const int32_t* sum16, int64_t K,
                     const std::vector<RowChunk>& chunks, int8_t* qi, float* si, float* smi, int32_t* sum16i) {
  const int64_t KB = K / 32, K16 = K / 16;
  at::parallel_for(0, (int64_t)chunks.size(), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t row0 = chunks[c].row0, R = chunks[c].rows;
      for (int64_t r = 0; r < R; ++r) {
        const int8_t* qr = q + (row0 + r) * K;
        int8_t* out = qi + row0 * K + r * 4;
        for (int64_t j = 0; j < K / 4; ++j) std::memcpy(out + j * R * 4, qr + 4 * j, 4);
        for (int64_t b = 0; b < KB; ++b) {
          si[row0 * KB + b * R + r] = s[(row0 + r) * KB + b];
          smi[row0 * KB + b * R + r] = sm[(row0 + r) * KB + b];
        }
        for (int64_t g = 0; g < K16; ++g) sum16i[row0 * K16 + g * R + r] = sum16[(row0 + r) * K16 + g];
      }
    }
  });
}

}  // namespace ember
