// How a tile's codes are stored, beyond the plain layouts of qlinear.cpp's header, and the
// preparation of a tile for calls with many rows.
//
// 6-bit (codes w in -32..31, Q6_K's and the Q5 types'): per block of 32 input values, the 8
// k-groups c of 4 (64 bytes each in the 8-bit layout) as u = w + 32 in 0..63: their low
// nibbles in 4 vectors (vector g: group g low, group 4 + g high, as the 4-bit layout) and
// their high 2 bits in 2 vectors (vector p: group 4p + i in bits 2i, 2i + 1): 384 bytes, the
// file's 6.5 bits a weight instead of 8.5, a quarter less to read per token.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ember {

// Decoding reads every weight once per token, so a tile kernel on one row is a stream of loads,
// and the hardware prefetcher alone left the memory bus idle part of the time: Qwen2.5-1.5B's
// matrices at one row took 28.6 ms without this and 21.8 ms with it (Zen 5, 2 threads, the two
// alternated in one process; when the VM's memory is slow both run at its rate). The kernels
// ask for the line PREFETCH bytes ahead of each one they load (4-16 KB measured alike).
constexpr int64_t PREFETCH = 8192;
static inline void prefetch_ahead(const void* p) { _mm_prefetch((const char*)p + PREFETCH, _MM_HINT_T0); }

// prefetch_ahead for the 6 lines of the 6-bit block at blk (the 6-bit kernels walk a block at a time).
static inline void prefetch_w6_block(const uint8_t* blk) {
  for (int l = 0; l < 6; ++l) prefetch_ahead(blk + l * 64);
}

// Code w of byte i of k-group c (0..7) of a 6-bit block: the scalar twin of w6_codes_512.
static inline int w6_code(const uint8_t* blk, int c, int64_t i) {
  const uint8_t v = blk[(c & 3) * 64 + i], h = blk[256 + (c >> 2) * 64 + i];
  return (((c < 4 ? v : v >> 4) & 0x0F) | (((h >> (2 * (c & 3))) & 3) << 4)) - 32;
}

// u of k-group C (all 16 columns x 4 values) of the 6-bit block at blk, C known at compile
// time: the nibble's half and the high bits' shift are immediates (a shift by a register, and
// two loads per k-group, made the 6-bit kernel compute-bound below the memory's rate).
template <int C>
__attribute__((target("avx512f,avx512bw"))) static inline __m512i w6_codes_512(const uint8_t* blk) {
  const __m512i v = _mm512_loadu_si512(blk + (C & 3) * 64);
  const __m512i lo = _mm512_and_si512(C < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
  const __m512i hb = _mm512_loadu_si512(blk + 256 + (C >> 2) * 64);
  // bits 2i, 2i + 1 of hb (i = C % 4) to bits 4, 5; what 16-bit shifts carry across bytes is masked off
  constexpr int i = C & 3;
  __m512i hi = hb;
  if constexpr (i < 2) hi = _mm512_slli_epi16(hb, 4 - 2 * i);
  else if constexpr (i == 3) hi = _mm512_srli_epi16(hb, 2);
  return _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi8(0x30)));
}

// The same for half h (columns 8h .. 8h + 7) of k-group C of the block at blk, C known at
// compile time: the nibble's half and the high bits' shift are immediates.
template <int C>
__attribute__((target("avx2"))) static inline __m256i w6_codes_256(const uint8_t* blk, int h) {
  const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + (C & 3) * 64 + h * 32));
  const __m256i lo = _mm256_and_si256(C < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  const __m256i hb = _mm256_loadu_si256((const __m256i*)(blk + 256 + (C >> 2) * 64 + h * 32));
  // bits 2i, 2i + 1 of hb (i = C % 4) to bits 4, 5; what 16-bit shifts carry across bytes is masked off
  constexpr int i = C & 3;
  __m256i hi = hb;
  if constexpr (i < 2) hi = _mm256_slli_epi16(hb, 4 - 2 * i);
  else if constexpr (i == 3) hi = _mm256_srli_epi16(hb, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}

// ---- prepared tiles, for calls with many rows (qlinear.cpp) ----

// A 4-bit tile's nibbles as bytes, per block of 32: [low g0..g3 | high g0..g3] x 64 bytes.
__attribute__((target("avx2"))) static void prepare_w4(const uint8_t* qw, int64_t K, uint8_t* out) {
  for (int64_t b = 0; b < K / 32; ++b)
    for (int64_t i = 0; i < 256; ++i) {
      out[b * 512 + i] = qw[b * 256 + i] & 0x0F;
      out[b * 512 + 256 + i] = qw[b * 256 + i] >> 4;
    }
}

// -128 * sum(w) per group of G and column of an 8-bit tile (byte 4c + j of k-group t is
// column c's weight 4t + j): the start of w8_512's sums over q + 128.
__attribute__((target("avx2"))) static void prepare_w8(const int8_t* qw, int64_t K, int64_t G, int32_t* wsum) {
  for (int64_t g = 0; g < K / G; ++g)
    for (int c = 0; c < 16; ++c) {
      int32_t sum = 0;
      for (int64_t t = g * G / 4; t < (g + 1) * G / 4; ++t)
        for (int j = 0; j < 4; ++j) sum += qw[t * 64 + 4 * c + j];
      wsum[g * 16 + c] = -128 * sum;
    }
}

// A 6-bit tile in the plain 8-bit layout, for the 8-bit kernels: signed codes w (offset 0, the
// AVX-512 kernel) or w + 32 (offset 32, the AVX2 one).
__attribute__((target("avx2"))) static void prepare_w6(const uint8_t* qw, int64_t K, int8_t* out, int offset) {
  for (int64_t j = 0; j < K / 4; ++j) {
    const uint8_t* blk = qw + (j >> 3) * 384;
    const int c = (int)(j & 7);
    for (int i = 0; i < 64; ++i) out[j * 64 + i] = (int8_t)(w6_code(blk, c, i) + offset);
  }
}

}  // namespace ember
