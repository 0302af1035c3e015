// The tile of keys of paged_attention.cpp, written once for both ISAs: its constants, the
// task a tile works on, and the macro bodies that paged_attention.cpp instantiates per target
// (the maths: paged_attention.cpp's header).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <limits>

namespace ember {
namespace {

constexpr int T = 64;  // keys per tile: the softmax bookkeeping is paid once per 64 keys and head
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
// Q8: llama.cpp's q8_0 cache, a row of D int8 codes then D/32 float16 scales (kv_quant.cpp)
enum Kind { F32 = 0, BF16 = 1, F16 = 2, Q8 = 3 };

struct Tile {
  const float* q;          // [G, D] the task's query heads
  const void* k[T];        // the tile's rows; lanes past n repeat the last real row
  const void* v[T];
  const int* nh;           // [G] the real keys of each head in this tile (<= n; < 0: none)
  int n, G, D;
  float scale;
  float *m, *l, *acc;      // [G], [G], [G, D] running max, sum, accumulator
  float *x, *alpha, *buf;  // [G, T] scores, then weights; [G] rescale factors; [16, D] widened rows
  const char* next_k[T];   // the next tile's rows (next_n of them, `lines` cache lines each), to
  const char* next_v[T];   // prefetch while this one computes
  int next_n, lines;
};

// The next tile's rows of sub-tile u into L2, 16 rows at a time, one burst per sub-tile: blocks
// are in no order, so the hardware prefetchers lose the stream at every block boundary, and one
// burst of the whole tile (256 lines at D = 64) outran the core's miss buffers and stalled it
// (1.2x the time of this at 2000 keys).
#define PREFETCH_ROWS(ROWS_, u)                                                 \
  for (int j = 16 * (u); j < std::min(t.next_n, 16 * (u) + 16); ++j)             \
    for (int c = 0; c < t.lines; ++c) _mm_prefetch(t.ROWS_[j] + 64 * c, _MM_HINT_T1);

// Sub-tile rows as float32: the pool's own rows, or (bf16, fp16, q8) widened once into buf.
// Rows past the r real ones repeat the last real one (their weights are 0).
#define WIDEN(LOAD, STORE, W)                                                     \
  for (int j = 0; j < 16; ++j) {                                                   \
    if constexpr (K == F32) {                                                      \
      out[j] = static_cast<const float*>(src[j]);                                  \
    } else {                                                                       \
      out[j] = buf + std::min(j, r - 1) * D;                                       \
      if (j < r)                                                                   \
        for (int i = 0; i < D; i += W) STORE(buf + j * D + i, LOAD<K>(src[j], i, D)); \
    }                                                                              \
  }

// The three passes over a tile, written once for both ISAs (V: __m512 or __m256, W floats a
// register; the vector functions below are overloaded on V), in panels of P registers of D:
// (1) scores, sub-tile by sub-tile: a panel of q in registers against the sub-tile's K rows
//     (from memory for the first head, from L1 for the others); W dot vectors summed across by
//     hsum (lane j = q . k_j);
// (2) each head's online-softmax update;
// (3) a += w V: the accumulator panel in registers, even and odd rows on two chains of FMAs.
// A head whose row ends before the tile's n (a task of several query rows) scores the keys past
// its end -inf, so their weights are 0: e^0 = 1 rescales and 0 * v adds leave its sums as a
// task of its row alone computes them, bit for bit.
// A macro, not a template: GCC inlines target-specific intrinsics only into functions of the
// same target, and one template cannot carry both targets.
#define TILE_BODY(V, W, ROWS)                                                                       \
  const int D = t.D, n = t.n, G = t.G;                                                              \
  float* __restrict x = t.x;                                                                        \
  const float* rows[16];                                                                            \
  for (int u = 0; u < T / W; ++u) {                                                                 \
    const int r = n - W * u; /* real keys in these W lanes */                                       \
    if ((W * u) % 16 == 0) { PREFETCH_ROWS(next_k, W * u / 16) }                                   \
    if (r > 0 && (W * u) % 16 == 0) ROWS(t.k + W * u, std::min(r, 16), t.buf, D, rows);             \
    const float* const* sub = rows + (W * u) % 16;                                                  \
    for (int g = 0; g < G; ++g) {                                                                   \
      const int rg = t.nh[g] - W * u; /* this head's real keys in these lanes */                    \
      if (rg <= 0) { store(x + g * T + W * u, set1<V>(NEG_INF)); continue; }                        \
      V dot[W];                                                                                     \
      for (int j = 0; j < W; ++j) dot[j] = set1<V>(0.f);                                            \
      for (int i0 = 0; i0 < D; i0 += W * P) {                                                       \
        V qv[P];                                                                                    \
        for (int c = 0; c < P; ++c) qv[c] = load<V>(t.q + g * D + i0 + W * c);                      \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; ++j)                                        \
          for (int c = 0; c < P; ++c) dot[j] = fma(qv[c], load<V>(sub[j] + i0 + W * c), dot[j]);     \
      }                                                                                             \
      store(x + g * T + W * u, masked(mul(hsum(dot), set1<V>(t.scale)), rg));                       \
    }                                                                                               \
  }                                                                                                 \
  for (int g = 0; g < G; ++g) {                                                                     \
    float* xg = x + g * T;                                                                          \
    V mx = set1<V>(NEG_INF), sum = set1<V>(0.f);                                                    \
    for (int u = 0; u < T / W; ++u) mx = vmax(mx, load<V>(xg + W * u));                             \
    const float m = std::max(t.m[g], hmax(mx));                                                     \
    for (int u = 0; u < T / W; ++u) { /* lanes past n: e^-inf = 0 */                                \
      const V w = vexp(add(load<V>(xg + W * u), set1<V>(-m)));                                      \
      sum = add(sum, w);                                                                            \
      store(xg + W * u, w);                                                                         \
    }                                                                                               \
    t.alpha[g] = first(vexp(set1<V>(t.m[g] - m))); /* 0 on the first tile (m = -inf) */             \
    t.l[g] = t.alpha[g] * t.l[g] + hadd(sum);                                                       \
    t.m[g] = m;                                                                                     \
  }                                                                                                 \
  for (int u = 0; u < T / 16 && 16 * u < n; ++u) {                                                  \
    PREFETCH_ROWS(next_v, u)                                                                        \
    ROWS(t.v + 16 * u, std::min(n - 16 * u, 16), t.buf, D, rows);                                   \
    for (int g = 0; g < G; ++g) {                                                                   \
      const float* wg = x + g * T + 16 * u;                                                         \
      const V keep = set1<V>(u == 0 ? t.alpha[g] : 1.f);                                            \
      float* a = t.acc + g * D;                                                                     \
      for (int i0 = 0; i0 < D; i0 += W * P) {                                                       \
        V o[2][P];                                                                                  \
        for (int c = 0; c < P; ++c) o[0][c] = mul(load<V>(a + i0 + W * c), keep), o[1][c] = set1<V>(0.f); \
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; ++j) {                                     \
          const V wj = set1<V>(wg[j]);                                                              \
          for (int c = 0; c < P; ++c) o[j % 2][c] = fma(wj, load<V>(rows[j] + i0 + W * c), o[j % 2][c]); \
        }                                                                                           \
        for (int c = 0; c < P; ++c) store(a + i0 + W * c, add(o[0][c], o[1][c]));                   \
      }                                                                                             \
    }                                                                                               \
  }

template <class V> V load(const float* p);
template <class V> V set1(float x);

// e^x for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial in r, 2^n put
// in the exponent bits; about 1 ulp). Below -87 (2^-126 is the smallest normal) it returns 0,
// for -inf too. ln2 is split in two (0.693359375 - 2.12194440e-4) so that n ln2 is exact.
#define EXP_BODY(V)                                                                                \
  const V xc = vmax(x, set1<V>(-87.f)), n = round_even(mul(xc, set1<V>(1.44269504f)));             \
  const V r = fnma(n, set1<V>(-2.12194440e-4f), fnma(n, set1<V>(0.693359375f), xc));                \
  V y = set1<V>(1.9875691500e-4f);                                                                 \
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) \
    y = fma(y, r, set1<V>(c));                                                                     \
  return zero_below(x, -87.f, mul(fma(y, mul(r, r), add(r, set1<V>(1.f))), pow2(n)));

}  // namespace
}  // namespace ember
