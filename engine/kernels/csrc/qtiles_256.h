// The AVX2 and AVX-VNNI tile kernels of qlinear.cpp (the AVX-512 ones and the activations'
// layout: qtiles.h): a tile is two halves of 8 columns, one ymm each. No include guard: this
// body is compiled twice by qtiles_avx2.h, once per path, each time inside the path's namespace
// with T256 its target and VNNI whether it has vpdpbusd, so that no AVX-VNNI instruction can
// reach the code an AVX2-only CPU runs.

template <typename S>
T256 static inline __m256 scale8(const S* p, int64_t g, int h) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p + g * 16 + h * 8);
  else if constexpr (std::is_same_v<S, at::Half>) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + g * 16 + h * 8)));
  else return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p->sup + (g >> p->shift) * 16 + h * 8))),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p->code + g * 16 + h * 8)))));
}

// sum of four u8*s8 products per int32 lane, added to acc (exact here: |u| <= 128, |s| <= 127).
T256 static inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
  if constexpr (VNNI) return _mm256_dpbusd_avx_epi32(acc, u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// dot + u0 . x0 + u1 . x1 per int32 lane for unsigned codes u <= 63 (6-bit): the maddubs pairs
// stay below 2^15 (|pairs| <= 2 * 2 * 63 * 127 = 32004), so two k-groups share one int16 sum.
T256 static inline __m256i dot_pair(__m256i dot, __m256i u0, __m256i x0, __m256i u1, __m256i x1) {
  if constexpr (VNNI) return dot4(dot4(dot, u0, x0), u1, x1);
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1));
  return _mm256_add_epi32(dot, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

T256 static inline void store8(float* y, __m256 v, const float* bias, int ncols) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  for (int c = 0; c < ncols; ++c) y[c] = bias ? tmp[c] + bias[c] : tmp[c];
}

// H: halves of the tile per pass. One row takes both at once, so each 64-byte line is used
// whole as it arrives and the row's broadcasts serve 16 columns; more rows need the registers.
template <int R, bool U, typename S>
T256 static void w4_256(const uint8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void*) {
  constexpr int H = R == 1 ? 2 : 1;
  const int64_t KB = a.K / 32;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const Chunk<R> c(a, row0);
  for (int h0 = 0; h0 < 2 && h0 * 8 < ncols; h0 += H) {
    __m256 acc[R][H];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < H; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      __m256i dot[R][H], pair[R][H];
#pragma GCC unroll(VNNI ? 1 : 4)  // AVX2: g known at compile time; AVX-VNNI (not measured here) as it was
      for (int g = 0; g < 4; ++g) {
        __m256i lo[H], hi[H];
        for (int i = 0; i < H; ++i) {
          const int h = h0 + i;
          if constexpr (U) {
            lo[i] = _mm256_loadu_si256((const __m256i*)(qw + b * 512 + g * 64 + h * 32));
            hi[i] = _mm256_loadu_si256((const __m256i*)(qw + b * 512 + 256 + g * 64 + h * 32));
          } else {
            if (h == 0) prefetch_ahead(qw + b * 256 + g * 64);  // a later half finds the line in cache
            const __m256i v = _mm256_loadu_si256((const __m256i*)(qw + b * 256 + g * 64 + h * 32));
            lo[i] = _mm256_and_si256(v, low), hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          }
        }
        for (int r = 0; r < R; ++r) {
          const __m256i x0 = _mm256_set1_epi32(c.codes4(8 * b + g, r));
          const __m256i x1 = _mm256_set1_epi32(c.codes4(8 * b + 4 + g, r));
          for (int i = 0; i < H; ++i) {
            if constexpr (VNNI) {
              if (g == 0) dot[r][i] = _mm256_setzero_si256();
              dot[r][i] = dot4(dot4(dot[r][i], lo[i], x0), hi[i], x1);
            } else {  // int16 pair sums of 4-bit products stay below 2^15 for a whole block of 32
              const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], x0), _mm256_maddubs_epi16(hi[i], x1));
              pair[r][i] = g ? _mm256_add_epi16(pair[r][i], p) : p;
              // The sums stay one chain per row: reassociated into a tree across the unrolled
              // groups, every product was live at once and the registers spilled.
              asm("" : "+x"(pair[r][i]));
            }
          }
        }
      }
      for (int i = 0; i < H; ++i) {
        if constexpr (!VNNI)  // |sum| <= 8 * 2 * 15 * 127 = 30480: exact in int16, then widened once
          for (int r = 0; r < R; ++r) dot[r][i] = _mm256_madd_epi16(pair[r][i], _mm256_set1_epi16(1));
        const __m256 d = scale8(dw, b, h0 + i), m = scale8(mw, b, h0 + i);
        for (int r = 0; r < R; ++r) {
          acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][i]), _mm256_mul_ps(d, _mm256_set1_ps(c.scale(b, r))),
                                      acc[r][i]);
          acc[r][i] = _mm256_fmadd_ps(m, _mm256_set1_ps(c.smin(b, r)), acc[r][i]);
        }
      }
    }
    for (int i = 0; i < H; ++i) {
      const int h = h0 + i, n = std::min(8, ncols - h * 8);
      for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r][i], bias ? bias + h * 8 : nullptr, n);
    }
  }
}

// Signed 8-bit weights: |w| goes in unsigned and the activation takes w's sign (vpsignb).
// PREP: a prepared 6-bit tile (prepare_w6), codes u = w + 32 as bytes in the plain layout: u
// goes in unsigned as it is (dot_pair) and 32 * sum(q) comes out.
template <int R, int G, bool MIN, bool PREP, typename S>
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
      for (int t = 0; t < G / 4; t += (PREP ? 2 : 1)) {
        const int64_t j = g * (G / 4) + t;
        if constexpr (PREP) {
          const __m256i u0 = _mm256_loadu_si256((const __m256i*)(qw + j * 64 + h * 32));
          const __m256i u1 = _mm256_loadu_si256((const __m256i*)(qw + (j + 1) * 64 + h * 32));
          for (int r = 0; r < R; ++r) {
            const __m256i x0 = _mm256_set1_epi32(c.codes4(j, r)), x1 = _mm256_set1_epi32(c.codes4(j + 1, r));
            dot[r] = dot_pair(dot[r], u0, x0, u1, x1);
          }
        } else {
          if (h == 0) prefetch_ahead(qw + j * 64);
          const __m256i w = _mm256_loadu_si256((const __m256i*)(qw + j * 64 + h * 32));
          const __m256i u = _mm256_abs_epi8(w);
          for (int r = 0; r < R; ++r)
            dot[r] = dot4(dot[r], u, _mm256_sign_epi8(_mm256_set1_epi32(c.codes4(j, r)), w));
        }
      }
      const __m256 d = scale8(dw, g, h);
      for (int r = 0; r < R; ++r) {
        if constexpr (PREP) {
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

// ---- 6-bit tiles (qformats.h), read as they are stored ---------------------------------------

// The pair of k-groups C, C + 1 of block b into the sums of rows and halves h0 .. h0 + H - 1
// (u = w + 32 in unsigned: dot_pair).
template <int C, int R, int H>
T256 static inline void w6_pair(const uint8_t* blk, int64_t b, int h0, const Chunk<R>& c, __m256i (&dot)[R][H]) {
  __m256i u0[H], u1[H];
  for (int i = 0; i < H; ++i) u0[i] = w6_codes_256<C>(blk, h0 + i), u1[i] = w6_codes_256<C + 1>(blk, h0 + i);
  for (int r = 0; r < R; ++r) {
    const __m256i x0 = _mm256_set1_epi32(c.codes4(8 * b + C, r)), x1 = _mm256_set1_epi32(c.codes4(8 * b + C + 1, r));
    for (int i = 0; i < H; ++i) dot[r][i] = dot_pair(dot[r][i], u0[i], x0, u1[i], x1);
  }
}

// Group g's sums into the rows' accumulators (32 * sum(q) out of the unsigned codes' sums), the
// same fma's in the same order as w8_256's, then the sums restart.
template <int R, int H, int G, bool MIN, typename S>
T256 static inline void w6_group(const S* dw, const S* mw, int64_t g, int h0, const Chunk<R>& c,
                                 __m256i (&dot)[R][H], __m256 (&acc)[R][H]) {
  for (int i = 0; i < H; ++i) {
    const __m256 d = scale8(dw, g, h0 + i);
    for (int r = 0; r < R; ++r) {
      const int32_t sum = G == 16 ? c.sum(g, r) : c.sum(2 * g, r) + c.sum(2 * g + 1, r);
      const __m256i exact = _mm256_sub_epi32(dot[r][i], _mm256_set1_epi32(32 * sum));
      acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(d, _mm256_set1_ps(c.scale(g * G / 32, r))),
                                  acc[r][i]);
      if (MIN) acc[r][i] = _mm256_fmadd_ps(scale8(mw, g, h0 + i), _mm256_set1_ps(min_term<G>(c, r, g)), acc[r][i]);
      dot[r][i] = _mm256_setzero_si256();
    }
  }
}

// 6-bit weights (Q6_K, G 16; the Q5 types, G 32), block by block with the k-group of every step
// known at compile time. H as in w4_256.
template <int R, int G, bool MIN, typename S>
T256 static void w6_256(const int8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void*) {
  constexpr int H = R == 1 ? 2 : 1;
  const int64_t KB = a.K / 32;
  const Chunk<R> c(a, row0);
  for (int h0 = 0; h0 < 2 && h0 * 8 < ncols; h0 += H) {
    __m256 acc[R][H];
    __m256i dot[R][H];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < H; ++i) acc[r][i] = _mm256_setzero_ps(), dot[r][i] = _mm256_setzero_si256();
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* blk = (const uint8_t*)qw + b * 384;
      if (h0 == 0)  // a later half finds the block in cache
        prefetch_w6_block(blk);
      w6_pair<0, R, H>(blk, b, h0, c, dot);
      w6_pair<2, R, H>(blk, b, h0, c, dot);
      if constexpr (G == 16) w6_group<R, H, G, MIN>(dw, mw, 2 * b, h0, c, dot, acc);
      w6_pair<4, R, H>(blk, b, h0, c, dot);
      w6_pair<6, R, H>(blk, b, h0, c, dot);
      w6_group<R, H, G, MIN>(dw, mw, G == 16 ? 2 * b + 1 : b, h0, c, dot, acc);
    }
    for (int i = 0; i < H; ++i) {
      const int h = h0 + i, n = std::min(8, ncols - h * 8);
      for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r][i], bias ? bias + h * 8 : nullptr, n);
    }
  }
}

