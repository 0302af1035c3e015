// Quantized linear y = x W^T + b on the CPU: int8 activations against 4- or 8-bit weight tiles.
//
// Activations: every row is cut into blocks of 32; block b gets s = max|x| / 127 and
// q = round(x / s) (ties to even), so x ~ s q (s kept as float16, as llama.cpp keeps it). Weights: tiles of 16 output columns; in each
// group of G input values a column has w = d q_w + m (G = 32 for 4-bit, 16 or 32 for 8-bit).
// Then for one row and one column
//     y = sum_g [ d_g s_b(g) (sum_k q_w q) + m_g s_b(g) (sum_k q) ]
// The inner sums are exact int32 (vpdpbusd, or maddubs + madd on AVX2); the float epilogue is
// the same sequence of fma's on every code path, lane by lane, so the AVX2, AVX-VNNI and
// AVX-512 VNNI paths give the same bits, and a row's bits never depend on the batch around it.
//
// Layouts (built by engine/kernels/pack.py, columns padded to a multiple of 16):
//   4-bit: qw uint8 [N/16, K/32, 4, 64]; chunk g byte 4c+j holds column c's weights
//          k = 4g+j (low nibble) and k = 16+4g+j (high nibble) of the block; d, m [N/16, K/32, 16].
//   8-bit: qw int8 [N/16, K/4, 64]; byte 4c+j of k-group t is column c's weight 4t+j;
//          d (and m, optional) [N/16, K/G, 16].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "ember.h"

namespace ember {

enum Path : int64_t { NONE = 0, AVX2 = 1, AVXVNNI = 2, AVX512VNNI = 3 };

int64_t best_path() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) return AVX512VNNI;
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NONE;
  if (__builtin_cpu_supports("avxvnni")) return AVXVNNI;
  return AVX2;
}

// Quantized activations of M rows: q [M, K], s and sm = s * sum(q) per 32, sums per 16.
struct Acts {
  const int8_t* q;
  const float* s;
  const float* sm;
  const int32_t* sum16;
  int64_t K;
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

// 16 columns' scales (or mins) as float32: stored float32, or float16 where that is exact.
template <typename S>
T512 static inline __m512 load_s16(const S* p) {
  if constexpr (std::is_same_v<S, float>) return _mm512_loadu_ps(p);
  else return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
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
    const __m512 d = load_s16(dw + b * 16), m = load_s16(mw + b * 16);
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
    const __m512 d = load_s16(dw + g * 16);
    for (int r = 0; r < R; ++r) {
      const int32_t* s16 = a.sum16 + (row0 + r) * (a.K / 16) + g * (G / 16);
      const int32_t sum = G == 16 ? s16[0] : s16[0] + s16[1];
      const __m512i exact = _mm512_sub_epi32(dot[r], _mm512_set1_epi32(128 * sum));
      const int64_t i = (row0 + r) * KB + g * G / 32;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, _mm512_set1_ps(a.s[i])), acc[r]);
      if (MIN) acc[r] = _mm512_fmadd_ps(load_s16(mw + g * 16), _mm512_set1_ps(min_term<G>(a, row0 + r, g)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store16(y + (row0 + r) * ldy, acc[r], bias, ncols);
}

// ---- AVX2 and AVX-VNNI: a tile is two halves of 8 columns, one ymm each --------------------

#define T256 __attribute__((target("avx2,fma,avxvnni,f16c")))

template <typename S>
T256 static inline __m256 load_s8(const S* p) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p);
  else return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
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
      const __m256 d = load_s8(dw + b * 16 + h * 8), m = load_s8(mw + b * 16 + h * 8);
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
      const __m256 d = load_s8(dw + g * 16 + h * 8);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (row0 + r) * KB + g * G / 32;
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, _mm256_set1_ps(a.s[i])), acc[r]);
        if (MIN)
          acc[r] = _mm256_fmadd_ps(load_s8(mw + g * 16 + h * 8), _mm256_set1_ps(min_term<G>(a, row0 + r, g)), acc[r]);
      }
    }
    const int n = std::min(8, ncols - h * 8);
    for (int r = 0; r < R; ++r) store8(y + (row0 + r) * ldy + h * 8, acc[r], bias ? bias + h * 8 : nullptr, n);
  }
}

// ---- dispatch -----------------------------------------------------------------------------

using TileFn = void (*)(const void*, const void*, const void*, const Acts&, int64_t, float*, int64_t,
                        const float*, int);

// The tile kernel for rows in chunks of R, for one format, scale type and path.
template <int R, typename S>
static TileFn tile_fn(int64_t path, int64_t bits, int64_t group, bool has_min) {
#define AS(f) reinterpret_cast<TileFn>(&f)
#define W8(K, ...) (group == 16 ? (has_min ? AS((K<R2, 16, true, ##__VA_ARGS__, S>)) : AS((K<R2, 16, false, ##__VA_ARGS__, S>))) \
                                : (has_min ? AS((K<R2, 32, true, ##__VA_ARGS__, S>)) : AS((K<R2, 32, false, ##__VA_ARGS__, S>))))
  if (path == AVX512VNNI) {
    constexpr int R2 = R;
    return bits == 4 ? AS((w4_512<R, S>)) : W8(w8_512);
  }
  constexpr int R2 = R > 4 ? 4 : R;  // 16 ymm registers: at most 4 rows at a time
  if (path == AVXVNNI) return bits == 4 ? AS((w4_256<R2, true, S>)) : W8(w8_256, true);
  return bits == 4 ? AS((w4_256<R2, false, S>)) : W8(w8_256, false);
#undef W8
#undef AS
}

template <typename S>
static void tile_fns(TileFn* fns, int64_t path, int64_t bits, int64_t group, bool has_min) {
  fns[0] = tile_fn<8, S>(path, bits, group, has_min);
  fns[1] = tile_fn<4, S>(path, bits, group, has_min);
  fns[2] = tile_fn<2, S>(path, bits, group, has_min);
  fns[3] = tile_fn<1, S>(path, bits, group, has_min);
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   const c10::optional<at::Tensor>& bias, int64_t n, int64_t bits, int64_t group, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), NT = (n + 15) / 16;
  TORCH_CHECK(K % 32 == 0, "K = ", K, " is not a multiple of 32");
  TORCH_CHECK(bits == 4 ? group == 32 : (bits == 8 && (group == 16 || group == 32)), "unsupported format: ", bits,
              "-bit, group ", group);
  TORCH_CHECK(qw.numel() == NT * K * bits / 8 * 16, "packed weight has ", qw.numel(), " bytes, expected ",
              NT * K * bits / 8 * 16);
  const bool half = d.scalar_type() == at::kHalf, has_min = m.has_value() && m->defined();
  TORCH_CHECK((half || d.scalar_type() == at::kFloat) && d.numel() == NT * (K / group) * 16,
              "scales must be float32 or float16 [N/16, K/G, 16]");
  TORCH_CHECK(!has_min || m->scalar_type() == d.scalar_type(), "mins must have the scales' dtype");
  TORCH_CHECK(bits == 8 || has_min, "4-bit weights need mins");
  if (path == 0) path = best_path();
  TORCH_CHECK(path >= AVX2 && path <= best_path(), "code path ", path, " is not available on this CPU");
  auto y = at::empty({M, n}, x.options());
  if (M == 0) return y;
  auto q = at::empty({M, K}, x.options().dtype(at::kChar));
  auto s = at::empty({M, K / 32}, x.options()), sm = at::empty({M, K / 32}, x.options());
  auto sum16 = at::empty({M, K / 16}, x.options().dtype(at::kInt));
  quantize_rows(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), s.data_ptr<float>(), sm.data_ptr<float>(),
                sum16.data_ptr<int32_t>());
  const Acts a{q.data_ptr<int8_t>(), s.data_ptr<float>(), sm.data_ptr<float>(), sum16.data_ptr<int32_t>(), K};
  TileFn fns[4];
  if (half) tile_fns<at::Half>(fns, path, bits, group, has_min);
  else tile_fns<float>(fns, path, bits, group, has_min);
  const int chunk[4] = {path == AVX512VNNI ? 8 : 4, 4, 2, 1};
  const auto* qb = static_cast<const uint8_t*>(qw.data_ptr());
  const auto* db = static_cast<const char*>(d.data_ptr());
  const auto* mb = has_min ? static_cast<const char*>(m->data_ptr()) : nullptr;
  const float* bb = bias.has_value() && bias->defined() ? bias->data_ptr<float>() : nullptr;
  float* yb = y.data_ptr<float>();
  const int64_t tile_bytes = K * bits / 8 * 16, tile_scales = (K / group) * 16 * d.element_size();
  at::parallel_for(0, NT, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int ncols = (int)std::min<int64_t>(16, n - t * 16);
      int64_t row = 0;
      for (int k = 0; k < 4; ++k)
        for (; M - row >= chunk[k]; row += chunk[k])
          fns[k](qb + t * tile_bytes, db + t * tile_scales, mb ? mb + t * tile_scales : nullptr, a, row,
                 yb + t * 16, n, bb ? bb + t * 16 : nullptr, ncols);
    }
  });
  return y;
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("best_path() -> int", &ember::best_path);
  lib.def("qlinear(Tensor x, Tensor qw, Tensor d, Tensor? m, Tensor? bias, int n, int bits, int group, int path) -> Tensor");
  lib.impl("qlinear", c10::DispatchKey::CPU, &ember::qlinear);
}
