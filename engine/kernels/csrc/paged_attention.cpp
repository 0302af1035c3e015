// Paged-attention decode on the CPU: one query token per sequence, K/V read in place from the pool.
//
// Sequence s has L = seq_lens[s] tokens of context; key/value j (position j) is row
// table[j / B] * B + j % B of the pool viewed as [num_blocks * B, n_kv, hd]. Query head h reads
// KV head h / G (G = H / n_kv query heads per KV head). For one query head:
//     x_j = scale * q . k_j,     o = sum_j e^(x_j - M) v_j / sum_j e^(x_j - M),   M = max_j x_j
// which is softmax(q K^T scale) V. Keys come in tiles of T = 64; with the running state
// (m, l, a) = (max so far, sum of e^(x - m), sum of e^(x - m) v) a tile updates it by
//     m' = max(m, max_tile x_j),  alpha = e^(m - m')          (alpha = 0 on the first tile, m = -inf)
//     l' = alpha l + sum_tile e^(x_j - m'),   a' = alpha a + sum_tile e^(x_j - m') v_j
// and o = a / l after the last: one pass, float32 throughout, no [L]-sized buffer, no copy of
// the context (flash attention's online softmax). Every term is rescaled to the same m, so this
// is the softmax above exactly, up to float32 rounding.
//
// One task is a KV head of a run of query rows that read the same blocks (a prompt chunk's rows,
// or a decode and its drafts: up to 16). Its heads, G per row, share each sub-tile of 16 rows,
// so a K/V row comes from memory and is widened to float32 (bf16/fp16/q8, into L1 scratch) once
// per task, and q (for scores) or the accumulator (for a += w V) sits in registers while the
// rows stream past. A head's arithmetic is that of its own row alone, whichever rows share its
// task (attention_tile.h), so a row's output has the same bits in any batch. The AVX2 and
// AVX-512 paths add in different orders: close, not equal. tests/kernels/test_paged_attention_kernel.py
// checks all of it against float64.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_tile.h"
#include "ember.h"  // paths: 1 AVX2, 2 AVX-VNNI (AVX2 for this kernel), 3 AVX-512

namespace ember {

namespace {

// ---- AVX-512: 16 floats a register; a sub-tile's 16 scores fill one -------------------------

#define T512 __attribute__((target("avx512f,fma,f16c")))
#define I512 __attribute__((target("avx512f,fma,f16c"), always_inline)) static inline

// Values i .. i + 15 of a row of D as float32 (q8: code times its block's scale, one rounding).
template <int K>
I512 __m512 load512(const void* row, int i, int D) {
  if constexpr (K == F32) return _mm512_loadu_ps(static_cast<const float*>(row) + i);
  if constexpr (K == Q8) {
    const int8_t* r = static_cast<const int8_t*>(row);
    const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + i))));
    return _mm512_mul_ps(c, _mm512_set1_ps(_cvtsh_ss(reinterpret_cast<const uint16_t*>(r + D)[i / 32])));
  }
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + i));
  if constexpr (K == BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

// Lane j of the result = the sum of a[j]'s 16 lanes: a transposing tree of 15 adds instead of
// 16 reductions. Each level halves the lanes a vector spends on one input (256-bit halves,
// 128-bit lanes, pairs in a lane); the last leaves input 4i + L in lane 4L + i, put back in
// order by the permute.
I512 __m512 hsum(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // b[i]: a[2i] in lanes 0-7, a[2i+1] in 8-15
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // c[i]: 128-bit lane L holds a[4i + L]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // d[i], lane L: a[8i + L] in floats 0 and 2, a[8i + 4 + L] in 1 and 3
    d[i] = _mm512_add_ps(_mm512_unpacklo_ps(c[2 * i], c[2 * i + 1]), _mm512_unpackhi_ps(c[2 * i], c[2 * i + 1]));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

template <int K>
T512 static void rows512(const void* const* src, int r, float* buf, int D, const float** out) {
  WIDEN(load512, _mm512_storeu_ps, 16)
}

template <> T512 __attribute__((always_inline)) inline __m512 load<__m512>(const float* p) { return _mm512_loadu_ps(p); }
template <> T512 __attribute__((always_inline)) inline __m512 set1<__m512>(float x) { return _mm512_set1_ps(x); }
I512 void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
I512 __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
I512 __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
I512 __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
I512 __m512 vmax(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
I512 __m512 fnma(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
I512 __m512 round_even(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
I512 __m512 pow2(__m512 n) {  // 2^n for integral n in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
I512 __m512 zero_below(__m512 x, float lo, __m512 y) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_GE_OQ), y);
}
I512 __m512 vexp(__m512 x) { EXP_BODY(__m512) }
I512 float hmax(__m512 v) { return _mm512_reduce_max_ps(v); }
I512 float hadd(__m512 v) { return _mm512_reduce_add_ps(v); }
I512 float first(__m512 v) { return _mm512_cvtss_f32(v); }
I512 __m512 masked(__m512 x, int r) {  // lanes r.. -> -inf
  return _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF), (__mmask16)(r >= 16 ? 0xFFFF : (1u << r) - 1), x);
}

template <int K, int P>
T512 static void tile512(const Tile& t) { TILE_BODY(__m512, 16, rows512<K>) }

// ---- AVX2 + FMA: 8 floats a register; a sub-tile's scores are two halves of 8 ---------------

#define T256 __attribute__((target("avx2,fma,f16c")))
#define I256 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

template <int K>
I256 __m256 load256(const void* row, int i, int D) {
  if constexpr (K == F32) return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  if constexpr (K == Q8) {
    const int8_t* r = static_cast<const int8_t*>(row);
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + i))));
    return _mm256_mul_ps(c, _mm256_set1_ps(_cvtsh_ss(reinterpret_cast<const uint16_t*>(r + D)[i / 32])));
  }
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
  if constexpr (K == BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

I256 float hadd(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)), h = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(h, h));
}
I256 float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// Lane j = the sum of a[j]'s 8 lanes: two levels of hadd leave a[j]'s halves in both 128-bit
// lanes of g0 (j < 4) or g1 (j >= 4); adding the lanes across finishes them, in order.
I256 __m256 hsum(const __m256* a) {
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

template <int K>
T256 static void rows256(const void* const* src, int r, float* buf, int D, const float** out) {
  WIDEN(load256, _mm256_storeu_ps, 8)
}

template <> T256 __attribute__((always_inline)) inline __m256 load<__m256>(const float* p) { return _mm256_loadu_ps(p); }
template <> T256 __attribute__((always_inline)) inline __m256 set1<__m256>(float x) { return _mm256_set1_ps(x); }
I256 void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
I256 __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
I256 __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
I256 __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
I256 __m256 vmax(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
I256 __m256 fnma(__m256 a, __m256 b, __m256 c) { return _mm256_fnmadd_ps(a, b, c); }
I256 __m256 round_even(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
I256 __m256 pow2(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
I256 __m256 zero_below(__m256 x, float lo, __m256 y) {
  return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_GE_OQ), y);
}
I256 __m256 vexp(__m256 x) { EXP_BODY(__m256) }
I256 float first(__m256 v) { return _mm256_cvtss_f32(v); }
I256 __m256 masked(__m256 x, int r) {  // lanes r.. -> -inf
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_blendv_ps(_mm256_set1_ps(NEG_INF), x, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(r), lane)));
}

template <int K, int P>
T256 static void tile256(const Tile& t) { TILE_BODY(__m256, 8, rows256<K>) }

using TileFn = void (*)(const Tile&);

// P = registers of D per panel: as many as divide D (in W-float registers) and fit the
// register file (AVX-512: 16 dot vectors + 8; AVX2: 8 dot vectors + 4).
template <int K>
TileFn tile_fn(bool avx512, int64_t D) {
  if (avx512) {
    const int64_t nw = D / 16;
    return nw % 8 == 0 ? tile512<K, 8> : nw % 4 == 0 ? tile512<K, 4> : nw % 2 == 0 ? tile512<K, 2> : tile512<K, 1>;
  }
  return (D / 8) % 4 == 0 ? tile256<K, 4> : tile256<K, 2>;  // D / 8 is even
}

// The runs of query rows that share tasks, as the first row of each and then S: consecutive rows
// that read the same blocks with the same tiles (rows of one sequence: a prompt chunk, or a
// decode and its drafts; full attention, or a window not yet full). Which rows share a task
// changes no bits (attention_tile.h), so runs are cut short (cap) to give each thread two tasks.
std::vector<int64_t> row_runs(const int64_t* table, int64_t MB, int64_t B, const int64_t* lens, int64_t S,
                              int64_t NKV, int64_t window, int64_t& cap) {
  const int64_t want = (2 * at::get_num_threads() + NKV - 1) / NKV;
  cap = std::max<int64_t>(1, std::min<int64_t>(16, (S + want - 1) / want));
  const auto fits = [&](int64_t s) { return window == 0 || lens[s] <= window; };  // its tiles start at 0
  std::vector<int64_t> run0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t r0 = run0.empty() ? -1 : run0.back();
    const bool joins = r0 >= 0 && s - r0 < cap && fits(s) && fits(r0) &&
                       std::equal(table + r0 * MB, table + r0 * MB + (lens[s] + B - 1) / B, table + s * MB);
    if (!joins) run0.push_back(s);
  }
  run0.push_back(S);
  return run0;
}

}  // namespace

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t path, int64_t window, const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(),
              "q must be contiguous float32 [S, H, head_dim], got ", q.scalar_type(), " ", q.sizes());
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous(),
              "k_cache must be a contiguous [num_blocks, block_size, n_kv, head_dim] pool, got ", k_cache.sizes());
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  v_cache.is_contiguous(), "v_cache must be contiguous with k_cache's shape and dtype");
  const auto dt = k_cache.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf || dt == at::kChar, "KV cache dtype ", dt,
              " is not supported (float32, bfloat16, float16, int8 rows of q8_0)");
  TORCH_CHECK(q.is_cpu() && k_cache.is_cpu() && block_tables.is_cpu() && seq_lens.is_cpu(), "tensors must be on the CPU");
  const int64_t S = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t NB = k_cache.size(0), B = k_cache.size(1), NKV = k_cache.size(2);
  const bool q8 = dt == at::kChar;  // rows of D codes and D / 32 float16 scales
  TORCH_CHECK(k_cache.size(3) == (q8 ? D + D / 16 : D), "head_dim of q (", D, ") and the cache's rows (",
              k_cache.size(3), ") differ");
  TORCH_CHECK(!q8 || D % 32 == 0, "a q8_0 cache needs head_dim a multiple of 32, not ", D);
  TORCH_CHECK(D % 16 == 0 && D > 0, "head_dim ", D, " is not a multiple of 16");
  TORCH_CHECK(NKV > 0 && H % NKV == 0, "num_heads ", H, " is not a multiple of num_kv_heads ", NKV);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kLong && block_tables.size(0) == S,
              "block_tables must be int64 [S = ", S, ", max_blocks], got ", block_tables.scalar_type(), " ",
              block_tables.sizes());
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kLong && seq_lens.size(0) == S,
              "seq_lens must be int64 [S = ", S, "]");
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: full attention), got ", window);
  TORCH_CHECK(!sinks || (sinks->scalar_type() == at::kFloat && sinks->numel() == H),
              "sinks must be float32 [num_heads = ", H, "]");
  const auto sink_c = sinks ? sinks->contiguous() : at::Tensor();
  const float* sink = sinks ? sink_c.data_ptr<float>() : nullptr;  // each head's sink logit (gpt-oss)
  if (path == 0) path = best_path();
  check_path(path);
  const auto bt = block_tables.contiguous(), sl = seq_lens.contiguous();
  const int64_t MB = bt.size(1), *table = bt.data_ptr<int64_t>(), *lens = sl.data_ptr<int64_t>();
  int64_t total = 0;  // checked here, not in the threads: a bad id would read outside the pool
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(lens[s] >= 1 && lens[s] <= MB * B, "seq_lens[", s, "] = ", lens[s], " is outside [1, ", MB * B, "]");
    for (int64_t b = 0; b < (lens[s] + B - 1) / B; ++b)
      TORCH_CHECK(table[s * MB + b] >= 0 && table[s * MB + b] < NB, "block_tables[", s, ", ", b, "] = ",
                  table[s * MB + b], " is not a block of the pool (", NB, " blocks)");
    total += window > 0 ? std::min(lens[s], window) : lens[s];
  }
  auto out = at::empty_like(q);
  if (S == 0) return out;
  const bool avx512 = path == 3;
  const TileFn fn = dt == at::kFloat ? tile_fn<F32>(avx512, D) : dt == at::kBFloat16 ? tile_fn<BF16>(avx512, D)
                    : dt == at::kHalf ? tile_fn<F16>(avx512, D) : tile_fn<Q8>(avx512, D);
  const int64_t G = H / NKV, row_bytes = k_cache.size(3) * k_cache.element_size();
  const char *kb = static_cast<const char*>(k_cache.data_ptr()), *vb = static_cast<const char*>(v_cache.data_ptr());
  const float* qb = q.data_ptr<float>();
  float* ob = out.data_ptr<float>();
  int64_t cap;  // the most rows a run holds
  const std::vector<int64_t> run0 = row_runs(table, MB, B, lens, S, NKV, window, cap);
  const int64_t runs = (int64_t)run0.size() - 1;
  // Small steps stay on one thread: waking a second costs a few microseconds, which two threads
  // win back only from about 150k multiply-adds (total * H * D) on a 2-core machine.
  const int64_t grain = total * H * D < (1 << 17) ? runs * NKV : 1;
  at::parallel_for(0, runs * NKV, grain, [&](int64_t t0, int64_t t1) {
    const int64_t GM = cap * G;  // the most heads a task holds
    std::vector<float> scratch(3 * GM + 2 * GM * D + GM * T + 16 * D);
    std::vector<int> nh(GM);
    Tile w;
    w.D = (int)D, w.scale = (float)scale, w.nh = nh.data(), w.lines = (int)((row_bytes + 63) / 64);
    w.m = scratch.data(), w.l = w.m + GM, w.alpha = w.l + GM, w.acc = w.alpha + GM, w.x = w.acc + GM * D;
    float* qg = w.x + GM * T;
    w.buf = qg + GM * D;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t s0 = run0[task / NKV], R = run0[task / NKV + 1] - s0, kvh = task % NKV;
      int64_t Lmax = 0;
      for (int64_t r = 0; r < R; ++r) Lmax = std::max(Lmax, lens[s0 + r]);
      w.G = (int)(R * G);
      for (int64_t r = 0; r < R; ++r)  // the run's heads of this KV head, row by row
        std::copy(qb + ((s0 + r) * H + kvh * G) * D, qb + ((s0 + r) * H + kvh * G + G) * D, qg + r * G * D);
      w.q = qg;
      std::fill(w.m, w.m + R * G, NEG_INF);
      std::fill(w.l, w.l + R * G, 0.f);  // alpha is set by each tile before it is read
      std::fill(w.acc, w.acc + R * G * D, 0.f);
      // A sliding window of W keys: the query at position L - 1 sees keys L - W .. L - 1.
      for (int64_t p0 = window > 0 ? std::max<int64_t>(0, Lmax - window) : 0; p0 < Lmax; p0 += T) {
        w.n = (int)std::min<int64_t>(T, Lmax - p0);
        for (int64_t r = 0; r < R; ++r)
          std::fill(nh.begin() + r * G, nh.begin() + (r + 1) * G, (int)std::min<int64_t>(T, lens[s0 + r] - p0));
        int64_t blk = p0 / B, in = p0 % B;  // position p0 + j = blk * B + in, stepped without divisions
        for (int j = 0; j < T; ++j) {
          const int64_t off = ((table[s0 * MB + blk] * B + in) * NKV + kvh) * row_bytes;
          w.k[j] = kb + off, w.v[j] = vb + off;
          if (j + 1 < w.n && ++in == B) in = 0, ++blk;  // lanes past n repeat the last real row
        }
        w.next_n = 0;  // the next tile's rows, prefetched while this one computes
        for (int64_t p = p0 + T; p < std::min(Lmax, p0 + 2 * T); ++p) {
          const int64_t off = ((table[s0 * MB + p / B] * B + p % B) * NKV + kvh) * row_bytes;
          w.next_k[w.next_n] = kb + off, w.next_v[w.next_n++] = vb + off;
        }
        fn(w);
      }
      for (int64_t r = 0; r < R; ++r) {
        float* o = ob + ((s0 + r) * H + kvh * G) * D;
        const float *acc = w.acc + r * G * D, *l = w.l + r * G, *m = w.m + r * G;
        for (int64_t h = 0; h < G; ++h) {
          // a sink: one more logit in the softmax over a zero value, e^(sink - m) more in the sum
          const float sum = sink ? l[h] + std::exp(sink[kvh * G + h] - m[h]) : l[h];
          for (int64_t i = 0; i < D; ++i) o[h * D + i] = acc[h * D + i] / sum;
        }
      }
    }
  });
  return out;
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
          "float scale, int path, int window=0, Tensor? sinks=None) -> Tensor");
  lib.impl("paged_attention_decode", c10::DispatchKey::CPU, &ember::paged_attention_decode);
}
