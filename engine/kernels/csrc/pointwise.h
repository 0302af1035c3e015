// The per-row glue of decoder.cpp between its matrix products: residual adds, RMSNorm (of rows
// and of heads), RoPE, SwiGLU and GeGLU, spread over torch's threads. Every value depends on its own row alone and each is
// computed by the same plain IEEE operations (no fused multiply-adds: -ffp-contract=off), so
// vector lanes, the scalar tail and any split into threads give the same bits: a token's
// outputs never depend on the batch around it.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ember {
namespace pointwise {

#define TPW __attribute__((target("avx2,fma")))

// Lambdas do not inherit a target attribute: each loop is a function of its own, called from
// the parallel region.

// y = x / sqrt(mean(x^2) + eps) * w per row, float32 (the mean accumulated in double).
TPW inline void rms_norm_rows(const float* x, const float* w, float* y, int64_t t0, int64_t t1, int64_t d, float eps) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* xr = x + t * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += (double)xr[i] * xr[i];
    const float inv = 1.f / std::sqrt((float)(ss / d) + eps);
    for (int64_t i = 0; i < d; ++i) y[t * d + i] = xr[i] * inv * w[i];
  }
}

inline void rms_norm(const float* x, const float* w, float* y, int64_t T, int64_t d, float eps) {
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) { rms_norm_rows(x, w, y, t0, t1, d, eps); });
}

// The same norm over each head of a row: heads 0..h1-1 of width hd at x + t * row_stride,
// weights w1 for heads < h1 - h2 (q) and w2 for the last h2 (k). In place.
TPW inline void rms_norm_head_rows(float* x, int64_t row_stride, const float* w1, const float* w2, int64_t t0,
                                   int64_t t1, int64_t heads, int64_t h2, int64_t hd, float eps) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * hd;
      rms_norm_rows(v, h < heads - h2 ? w1 : w2, v, 0, 1, hd, eps);
    }
}

inline void rms_norm_heads_(float* x, int64_t row_stride, const float* wq, const float* wk, int64_t T,
                            int64_t heads, int64_t k_heads, int64_t hd, float eps) {
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    rms_norm_head_rows(x, row_stride, wq, wk, t0, t1, heads, k_heads, hd, eps);
  });
}

TPW inline void add_range(float* r, const float* h, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) r[i] += h[i];
}

inline void add_(float* r, const float* h, int64_t n) {
  at::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) { add_range(r, h, i0, i1); });
}

// Rotate-half RoPE in place on `heads` heads of every row: with C = [cos | cos] and
// S = [-sin | sin] (rotary.rotation_tables), x' = x C + roll(x, d/2) S.
TPW inline void rope_rows(float* x, int64_t row_stride, const float* C, const float* S, int64_t t0, int64_t t1,
                          int64_t heads, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * hd;
      const float* c = C + t * hd;
      const float* s = S + t * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] + b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
}

inline void rope_(float* x, int64_t row_stride, const float* C, const float* S, int64_t T, int64_t heads,
                  int64_t hd) {
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) { rope_rows(x, row_stride, C, S, t0, t1, heads, hd); });
}

// e^x with glibc's expf bits, 8 lanes at a time. glibc (2.27 on, from ARM's optimized-routines)
// computes in double: k = round(x 32/ln2), r = x 32/ln2 - k, e^x = 2^(k/32) 2^(r/32) with
// 2^(k/32) = tab[k mod 32] carrying k div 32 in its exponent and 2^(r/32) a cubic in r, then one
// rounding to float. Those double operations are exact enough that the order of their roundings
// never reaches the float result: this code (FMAs or not) gave glibc 2.36's expf bit for bit on
// all 2.24e9 floats in [-103, 88]. Lanes outside |x| < 88 (overflow, underflow, inf, nan) take
// glibc's own expf. tests/kernels/test_pointwise_kernels.py checks against libm's expf.
struct Exp2Table {
  uint64_t bits[32];  // bits of 2^(i/32) less i << 47, so that adding k << 47 gives 2^(k/32)
  Exp2Table() {
    for (int i = 0; i < 32; ++i) {
      const double v = std::exp2(i / 32.0);
      std::memcpy(&bits[i], &v, 8);
      bits[i] -= (uint64_t)i << 47;
    }
  }
};
inline const Exp2Table kExp2;

TPW inline __m256d exp_half(__m128 x) {
  constexpr double inv_ln2_32 = 0x1.71547652b82fep+0 * 32, shift = 0x1.8p+52;  // shift: rounds to an integer
  constexpr double c0 = 0x1.c6af84b912394p-5 / 32768, c1 = 0x1.ebfce50fac4f3p-3 / 1024, c2 = 0x1.62e42ff0c52d6p-1 / 32;
  const __m256d z = _mm256_mul_pd(_mm256_set1_pd(inv_ln2_32), _mm256_cvtps_pd(x));
  const __m256d kd = _mm256_add_pd(z, _mm256_set1_pd(shift));  // k in the low bits
  const __m256i k = _mm256_castpd_si256(kd);
  const __m256d r = _mm256_sub_pd(z, _mm256_sub_pd(kd, _mm256_set1_pd(shift)));
  const __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExp2.bits),
                                           _mm256_and_si256(k, _mm256_set1_epi64x(31)), 8);
  const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(k, 47)));
  const __m256d p = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(c0), r), _mm256_set1_pd(c1));
  const __m256d q = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(c2), r), _mm256_set1_pd(1.0));
  return _mm256_mul_pd(_mm256_add_pd(_mm256_mul_pd(p, _mm256_mul_pd(r, r)), q), s);
}

TPW inline __m256 exp8(__m256 x) {
  const __m256 y = _mm256_set_m128(_mm256_cvtpd_ps(exp_half(_mm256_extractf128_ps(x, 1))),
                                   _mm256_cvtpd_ps(exp_half(_mm256_castps256_ps128(x))));
  const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), x), _mm256_set1_ps(88.f), _CMP_NLT_UQ);
  if (__builtin_expect(!_mm256_movemask_ps(big), 1)) return y;
  alignas(32) float xs[8], ys[8];
  _mm256_store_ps(xs, x), _mm256_store_ps(ys, y);
  for (int j = 0; j < 8; ++j)
    if (!(std::fabs(xs[j]) < 88.f)) ys[j] = std::exp(xs[j]);
  return _mm256_load_ps(ys);
}

// g / (1 + e) * u into y: the gated activations' last steps, as their scalar lines order them.
TPW inline void store_gated(float* y, __m256 g, __m256 e, const float* u) {
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), _mm256_loadu_ps(u)));
}

// [gate | up] -> silu(gate) * up, silu(g) = g / (1 + e^-g), for values i0..i1 of row t. glibc's
// expf bits (exp8), not a cheaper polynomial: the fidelity bar against llama.cpp sits close
// enough to the int8 codes' rounding noise that a 1-ulp change of e^x moved top-1 agreement by 0.7%.
TPW inline void silu_mul_row(const float* g, const float* u, float* y, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    store_gated(y + i, gv, exp8(_mm256_xor_ps(gv, _mm256_set1_ps(-0.f))), u + i);  // e^-g
  }
  for (; i < i1; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

// [gate | up] -> gelu(gate) * up with GELU's tanh form (ggml_gelu, HF gelu_pytorch_tanh):
// gelu(g) = 0.5 g (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3). Since 0.5 (1 + tanh(z)) =
// 1 / (1 + e^-2z), it is g / (1 + e^-2z): expf's bits, as silu's, where tanhf (expm1f inside)
// cost a fifth of a Gemma prefill, and no cancellation in 1 + tanh(z) for z << 0.
TPW inline void gelu_mul_row(const float* g, const float* u, float* y, int64_t i0, int64_t i1) {
  constexpr float k2 = 2 * 0.7978845608028654f;  // 2 sqrt(2/pi)
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {  // the scalar line's operations in its order
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), gv), gv), gv);
    store_gated(y + i, gv, exp8(_mm256_mul_ps(_mm256_set1_ps(-k2), _mm256_add_ps(gv, cube))), u + i);
  }
  for (; i < i1; ++i) y[i] = g[i] / (1.f + std::exp(-k2 * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
}

// act(gate) * up over T rows of [gate | up] (2f wide) into y [T, f]; gelu: GeGLU, else SwiGLU.
inline void gated_act(const float* gu, float* y, int64_t T, int64_t f, bool gelu) {
  at::parallel_for(0, T * f, 1024, [&](int64_t i0, int64_t i1) {
    for (int64_t t = i0 / f; t * f < i1; ++t) {
      const int64_t a = std::max(i0, t * f) - t * f, b = std::min(i1, (t + 1) * f) - t * f;
      if (gelu)
        gelu_mul_row(gu + t * 2 * f, gu + t * 2 * f + f, y + t * f, a, b);
      else
        silu_mul_row(gu + t * 2 * f, gu + t * 2 * f + f, y + t * f, a, b);
    }
  });
}

#undef TPW

}  // namespace pointwise
}  // namespace ember
