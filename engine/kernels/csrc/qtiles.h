// The tile kernels of qlinear.cpp: one tile of 16 output columns against R rows of int8
// activations, per weight format, for the AVX-512 VNNI path (AVX2 and AVX-VNNI: qtiles_avx2.h;
// the maths and layouts: qlinear.cpp's header).
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "qformats.h"

namespace ember {

// Quantized activations of M rows: q [M, K], s and sm = s * sum(q) per 32, sums per 16, each
// stored chunk by chunk as the tile loop takes the rows (qlinear.cpp's `row_chunks`): a chunk
// of R rows from row0 holds code k of its row r at q[row0 K + (k / 4 * R + r) 4 + k % 4] and
// the per-block values at [row0 K/32 + b R + r] (sums: K/16). Every broadcast is then one base
// pointer plus a constant offset; with a pointer per row the compiler ran out of registers and
// the spills took the ports the dot products need. A chunk of one row is the plain layout.
struct Acts {
  const int8_t* q;
  const float* s;
  const float* sm;
  const int32_t* sum16;
  int64_t K;
  const uint8_t* qu = nullptr;  // q + 128 (q xor 0x80), for prepared 8-bit tiles
};

static inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The chunk of R rows that starts at row0.
template <int R>
struct Chunk {
  const int8_t* q;
  const float* s;
  const float* sm;
  const int32_t* sum16;
  Chunk(const Acts& a, int64_t row0)
      : q(a.q + row0 * a.K), s(a.s + row0 * (a.K / 32)), sm(a.sm + row0 * (a.K / 32)),
        sum16(a.sum16 + row0 * (a.K / 16)), qu(a.qu ? a.qu + row0 * a.K : nullptr) {}
  const uint8_t* qu;
  int32_t codes4(int64_t j, int r) const { return load4(q + (j * R + r) * 4); }  // k = 4j .. 4j+3
  int32_t codes4u(int64_t j, int r) const { return load4((const int8_t*)qu + (j * R + r) * 4); }
  float scale(int64_t b, int r) const { return s[b * R + r]; }
  float smin(int64_t b, int r) const { return sm[b * R + r]; }
  int32_t sum(int64_t g16, int r) const { return sum16[g16 * R + r]; }
};

// K-quant scales of one tile: group g's = sup[g >> shift] (float16, per super-block of 256
// values, 2^shift groups) * code[g]. A shift, not a division: two idivs a block in the loop
// cost about as much as its dot products.
struct KScales {
  const at::Half* sup;
  const int8_t* code;
  int64_t shift;
};

// s * sum(q) over group g of a row: the factor of the min m in y (per 32 precomputed, per 16 here).
template <int G, int R>
static inline float min_term(const Chunk<R>& c, int r, int64_t g) {
  if constexpr (G == 32) return c.smin(g, r);
  return c.scale(g / 2, r) * (float)c.sum(g, r);
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
  else return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p->sup + (g >> p->shift) * 16))),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p->code + g * 16)))));
}

T512 static inline void store16(float* y, __m512 v, const float* bias, int ncols) {
  if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps((__mmask16)((1u << ncols) - 1), bias));
  _mm512_mask_storeu_ps(y, (__mmask16)((1u << ncols) - 1), v);
}

// Group g's K-quant scales from the float16 super-block scale already converted (sup, once per
// super-block instead of once per group): the same product d * sc as scale16's, so the same bits.
T512 static inline __m512 kscale16(__m512 sup, const KScales* p, int64_t g) {
  return _mm512_mul_ps(sup, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p->code + g * 16)))));
}

T512 static inline __m512 ksup16(const KScales* p, int64_t g) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p->sup + (g >> p->shift) * 16)));
}

// Group g's scales, or mins, in order of g: a K-quant tile's float16 super-block scale is
// converted once per super-block (kscale16: the same bits as scale16's).
template <typename S>
struct GroupScales16 {
  const S* p;
  __m512 sup;
  T512 GroupScales16(const S* p) : p(p), sup(_mm512_setzero_ps()) {}
  T512 __m512 operator()(int64_t g) {
    if constexpr (std::is_same_v<S, KScales>) {
      if ((g & ((int64_t{1} << p->shift) - 1)) == 0) sup = ksup16(p, g);
      return kscale16(sup, p, g);
    } else {
      return scale16(p, g);
    }
  }
};

// U: the tile comes prepared (prepare_w4): per block the 4 low-nibble vectors, then the 4 high.
template <int R, bool U, typename S>
T512 static void w4_512(const uint8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void*) {
  const int64_t KB = a.K / 32;
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
  GroupScales16<S> ds(dw), ms(mw);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const Chunk<R> c(a, row0);
  for (int64_t b = 0; b < KB; ++b) {
    // Few rows: two chains of sums per row (low and high nibbles) so vpdpbusd's latency does
    // not idle the ports; int32 addition is exact in any order. Many rows hide it anyway.
    constexpr bool SPLIT = R < 4;
    // With the chains split, the high nibbles go in where they are (16 h, at most 240: still
    // unsigned bytes) and their chain, a multiple of 16, is shifted back once a block: one
    // shift instead of four. |16 * 4 * 4 * 15 * 128| < 2^31: exact.
    constexpr bool HI16 = SPLIT && !U;
    __m512i dot[R], dhi[R];
    for (int r = 0; r < R; ++r) dot[r] = dhi[r] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      __m512i lo, hi;
      if constexpr (U) {
        lo = _mm512_loadu_si512(qw + b * 512 + g * 64), hi = _mm512_loadu_si512(qw + b * 512 + 256 + g * 64);
      } else {
        prefetch_ahead(qw + b * 256 + g * 64);
        const __m512i v = _mm512_loadu_si512(qw + b * 256 + g * 64);
        lo = _mm512_and_si512(v, low);
        hi = HI16 ? _mm512_and_si512(v, high) : _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int r = 0; r < R; ++r) {
        dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(c.codes4(8 * b + g, r)));
        __m512i& h = SPLIT ? dhi[r] : dot[r];
        h = _mm512_dpbusd_epi32(h, hi, _mm512_set1_epi32(c.codes4(8 * b + 4 + g, r)));
      }
    }
    if constexpr (SPLIT)
      for (int r = 0; r < R; ++r) dot[r] = _mm512_add_epi32(dot[r], HI16 ? _mm512_srai_epi32(dhi[r], 4) : dhi[r]);
    const __m512 d = ds(b), m = ms(b);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, _mm512_set1_ps(c.scale(b, r))), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(c.smin(b, r)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store16(y + (row0 + r) * ldy, acc[r], bias, ncols);
}

// 8-bit weights are signed; vpdpbusd wants one unsigned side, so w + 128 goes in (xor 0x80)
// and 128 * sum(q) comes back out of the exact int32 sum. U (a prepared tile, many rows): the
// activations go in as q + 128 instead, and the sums start from -128 * sum(w) of each group
// and column (`wsum`, prepare_w8), which costs nothing per row: the same exact integers.
template <int R, int G, bool MIN, bool U, typename S>
T512 static void w8_512(const int8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void* wsum) {
  const int64_t NG = a.K / G;
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const Chunk<R> c(a, row0);
  for (int64_t g = 0; g < NG; ++g) {
    constexpr bool SPLIT = R < 4;  // as in w4_512
    __m512i dot[R], odd[R];
    const __m512i init = U ? _mm512_loadu_si512((const int32_t*)wsum + g * 16) : _mm512_setzero_si512();
    for (int r = 0; r < R; ++r) dot[r] = init, odd[r] = _mm512_setzero_si512();
    for (int t = 0; t < G / 4; t += 2) {
      const int64_t j = g * (G / 4) + t;
      if constexpr (!U) prefetch_ahead(qw + j * 64), prefetch_ahead(qw + (j + 1) * 64);
      const __m512i w0 = _mm512_loadu_si512(qw + j * 64), w1 = _mm512_loadu_si512(qw + (j + 1) * 64);
      const __m512i u0 = _mm512_xor_si512(w0, flip), u1 = _mm512_xor_si512(w1, flip);
      for (int r = 0; r < R; ++r) {
        __m512i& o = SPLIT ? odd[r] : dot[r];
        if constexpr (U) {  // unsigned activations, signed weights
          dot[r] = _mm512_dpbusd_epi32(dot[r], _mm512_set1_epi32(c.codes4u(j, r)), w0);
          o = _mm512_dpbusd_epi32(o, _mm512_set1_epi32(c.codes4u(j + 1, r)), w1);
        } else {
          dot[r] = _mm512_dpbusd_epi32(dot[r], u0, _mm512_set1_epi32(c.codes4(j, r)));
          o = _mm512_dpbusd_epi32(o, u1, _mm512_set1_epi32(c.codes4(j + 1, r)));
        }
      }
    }
    if constexpr (SPLIT)
      for (int r = 0; r < R; ++r) dot[r] = _mm512_add_epi32(dot[r], odd[r]);
    const __m512 d = scale16(dw, g);
    for (int r = 0; r < R; ++r) {
      __m512i exact = dot[r];
      if constexpr (!U) {
        const int32_t sum = G == 16 ? c.sum(g, r) : c.sum(2 * g, r) + c.sum(2 * g + 1, r);
        exact = _mm512_sub_epi32(dot[r], _mm512_set1_epi32(128 * sum));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, _mm512_set1_ps(c.scale(g * G / 32, r))),
                               acc[r]);
      if (MIN) acc[r] = _mm512_fmadd_ps(scale16(mw, g), _mm512_set1_ps(min_term<G>(c, r, g)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store16(y + (row0 + r) * ldy, acc[r], bias, ncols);
}

// ---- 6-bit tiles (qformats.h), read as they are stored ---------------------------------------

// The pair of k-groups C, C + 1 of block b into the rows' sums: u = w + 32 (unsigned) against
// the signed activation codes, as w8_512 takes w + 128.
template <int C, int R>
T512 static inline void w6_pair512(const uint8_t* blk, int64_t b, const Chunk<R>& c, __m512i (&dot)[R],
                                   __m512i (&odd)[R]) {
  constexpr bool SPLIT = R < 4;  // as in w4_512
  const __m512i u0 = w6_codes_512<C>(blk), u1 = w6_codes_512<C + 1>(blk);
  for (int r = 0; r < R; ++r) {
    dot[r] = _mm512_dpbusd_epi32(dot[r], u0, _mm512_set1_epi32(c.codes4(8 * b + C, r)));
    __m512i& o = SPLIT ? odd[r] : dot[r];
    o = _mm512_dpbusd_epi32(o, u1, _mm512_set1_epi32(c.codes4(8 * b + C + 1, r)));
  }
}

// Group g's sums into the accumulators (32 * sum(q) out of the unsigned codes' sums): the
// same fma's in the same order as w8_512's and the AVX2 paths', so the same bits; the sums restart.
template <int R, int G, bool MIN, typename S>
T512 static inline void w6_group512(GroupScales16<S>& ds, GroupScales16<S>& ms, int64_t g, const Chunk<R>& c,
                                    __m512i (&dot)[R], __m512i (&odd)[R], __m512 (&acc)[R]) {
  const __m512 d = ds(g);
  __m512 m = _mm512_setzero_ps();
  if constexpr (MIN) m = ms(g);
  for (int r = 0; r < R; ++r) {
    const int32_t sum = G == 16 ? c.sum(g, r) : c.sum(2 * g, r) + c.sum(2 * g + 1, r);
    const __m512i exact = _mm512_sub_epi32(R < 4 ? _mm512_add_epi32(dot[r], odd[r]) : dot[r], _mm512_set1_epi32(32 * sum));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, _mm512_set1_ps(c.scale(g * G / 32, r))), acc[r]);
    if (MIN) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(min_term<G>(c, r, g)), acc[r]);
    dot[r] = odd[r] = _mm512_setzero_si512();
  }
}

// 6-bit weights (Q6_K, G 16; the Q5 types, G 32), a 384-byte block at a time with the k-group
// of every step known at compile time.
template <int R, int G, bool MIN, typename S>
T512 static void w6_512(const int8_t* qw, const S* dw, const S* mw, const Acts& a, int64_t row0,
                        float* y, int64_t ldy, const float* bias, int ncols, const void*) {
  const int64_t KB = a.K / 32;
  const Chunk<R> c(a, row0);
  GroupScales16<S> ds(dw), ms(mw);
  __m512 acc[R];
  __m512i dot[R], odd[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), dot[r] = odd[r] = _mm512_setzero_si512();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* blk = (const uint8_t*)qw + b * 384;
    prefetch_w6_block(blk);
    w6_pair512<0, R>(blk, b, c, dot, odd);
    w6_pair512<2, R>(blk, b, c, dot, odd);
    if constexpr (G == 16) w6_group512<R, G, MIN>(ds, ms, 2 * b, c, dot, odd, acc);
    w6_pair512<4, R>(blk, b, c, dot, odd);
    w6_pair512<6, R>(blk, b, c, dot, odd);
    w6_group512<R, G, MIN>(ds, ms, G == 16 ? 2 * b + 1 : b, c, dot, odd, acc);
  }
  for (int r = 0; r < R; ++r) store16(y + (row0 + r) * ldy, acc[r], bias, ncols);
}

}  // namespace ember
