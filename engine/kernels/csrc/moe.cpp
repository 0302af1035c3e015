// A mixture of experts' FFN inside the decoder stack (llama.cpp's build_moe_ffn, the family's
// Routing as moe_route's arguments):
//
//     p = softmax(x R^T)                   float32 logits over all E experts
//     w, e = top_k(p)                      (w / sum(w) where the family renormalises)
//     h = sum_j  w_j * down_e_j(act(gate_up_e_j(x)))     added in rank order
//     h = h + sigmoid(x . g) * down_s(act(gate_up_s(x)))  a shared expert, where the family has one
//
// The step's T k (row, expert) slots are sorted stably by expert (a counting sort), each
// expert's rows gathered into one block and run through its gate_up and down tiles as one
// qlinear call, so an expert's weights are read once a step whatever the number of chats that
// take it, and a decode of one stream reads only its k experts. Every product is row-invariant
// (qlinear, the activation, the router's fixed-order dots), so a row gets the same bits alone
// or in any batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "moe.h"
#include "pointwise.h"

namespace ember {
namespace {

// One logit: x . w over D floats, in 4 x 8 lanes of fused multiply-adds, then a fixed tree: the
// same order for every row and batch.
__attribute__((target("avx2,fma"))) float dot(const float* x, const float* w, int64_t D) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= D; i += 32)
    for (int a = 0; a < 4; ++a)
      acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * a), _mm256_loadu_ps(w + i + 8 * a), acc[a]);
  const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float out = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < D; ++i) out += x[i] * w[i];
  return out;
}

// One row's scores (E logits, in place) -> its k weights and experts.
void route_row(float* p, int64_t E, int64_t k, bool norm, float* w, int64_t* e) {
  float mx = p[0];
  for (int64_t i = 1; i < E; ++i) mx = std::max(mx, p[i]);
  float sum = 0.f;
  for (int64_t i = 0; i < E; ++i) sum += (p[i] = std::exp(p[i] - mx));
  for (int64_t i = 0; i < E; ++i) p[i] /= sum;
  float total = 0.f;
  for (int64_t j = 0; j < k; ++j) {  // k passes: k is small (8 of 128 at most in today's files)
    int64_t best = -1;
    for (int64_t i = 0; i < E; ++i) {
      bool taken = false;
      for (int64_t r = 0; r < j; ++r) taken |= e[r] == i;
      if (!taken && (best < 0 || p[i] > p[best])) best = i;
    }
    e[j] = best, w[j] = p[best], total += p[best];
  }
  if (norm)
    for (int64_t j = 0; j < k; ++j) w[j] /= total;
}

}  // namespace

void moe_route(const float* x, int64_t T, int64_t D, const float* W, int64_t E, int64_t k, bool norm, float* weights,
               int64_t* experts) {
  TORCH_CHECK(0 < k && k <= E, "top ", k, " of ", E, " experts");
  std::vector<float> logits(T * E);
  at::parallel_for(0, T * E, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) logits[i] = dot(x + i / E * D, W + i % E * D, D);
  });
  for (int64_t t = 0; t < T; ++t) route_row(logits.data() + t * E, E, k, norm, weights + t * k, experts + t * k);
}

void MoeFfn::operator()(const at::Tensor& x, const Linear* experts, int64_t path, bool gelu, at::Tensor& h,
                        at::Tensor& scratch) const {
  const int64_t T = x.size(0), D = x.size(1), E = router.size(0), S = T * k;
  const auto f32 = x.options();
  std::vector<float> w(S);
  std::vector<int64_t> e(S), count(E + 1, 0), order(S), at_slot(S);
  moe_route(x.data_ptr<float>(), T, D, router.data_ptr<float>(), E, k, norm, w.data(), e.data());
  for (int64_t s = 0; s < S; ++s) ++count[e[s] + 1];
  for (int64_t i = 0; i < E; ++i) count[i + 1] += count[i];  // count[i]: expert i's first row
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t s = 0; s < S; ++s) order[next[e[s]]] = s, at_slot[s] = next[e[s]]++;  // stable: slots in order
  auto rows = at::empty({S, D}, f32), gu = at::empty({S, 2 * width}, f32), act = at::empty({S, width}, f32);
  auto y = at::empty({S, D}, f32);
  const float* xb = x.data_ptr<float>();
  float* rb = rows.data_ptr<float>();
  at::parallel_for(0, S, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::copy(xb + order[r] / k * D, xb + (order[r] / k + 1) * D, rb + r * D);
  });
  for (int64_t i = 0; i < E; ++i) {
    const int64_t r0 = count[i], n = count[i + 1] - r0;
    if (!n) continue;
    auto gu_i = gu.narrow(0, r0, n), act_i = act.narrow(0, r0, n), y_i = y.narrow(0, r0, n);
    experts[2 * i](rows.narrow(0, r0, n), path, gu_i, scratch);
    pointwise::gated_act(gu_i.data_ptr<float>(), act_i.data_ptr<float>(), n, width, gelu);
    experts[2 * i + 1](act_i, path, y_i, scratch);
  }
  // each row's k products w_j y_j, added in rank order (engine/layers/moe.py's order)
  const float* yb = y.data_ptr<float>();
  float* hb = h.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const float wj = w[t * k + j], *yj = yb + at_slot[t * k + j] * D;
        float* ht = hb + t * D;
        if (j == 0)
          for (int64_t d = 0; d < D; ++d) ht[d] = yj[d] * wj;
        else
          for (int64_t d = 0; d < D; ++d) ht[d] = ht[d] + yj[d] * wj;
      }
  });
  if (shared_gate.defined()) add_shared(x, experts + 2 * E, path, gelu, h, scratch);
}

// The shared expert: every row through its gate_up and down as one block, then h += s * g with
// g = sigmoid(x . gate) per row (llama.cpp's qwen2moe graph: the gate's logit, silu(z) / z).
void MoeFfn::add_shared(const at::Tensor& x, const Linear* shared, int64_t path, bool gelu, at::Tensor& h,
                        at::Tensor& scratch) const {
  const int64_t T = x.size(0), D = x.size(1);
  const auto f32 = x.options();
  auto gu = at::empty({T, 2 * shared_width}, f32), act = at::empty({T, shared_width}, f32), y = at::empty({T, D}, f32);
  shared[0](x, path, gu, scratch);
  pointwise::gated_act(gu.data_ptr<float>(), act.data_ptr<float>(), T, shared_width, gelu);
  shared[1](act, path, y, scratch);
  const float *xb = x.data_ptr<float>(), *gb = shared_gate.data_ptr<float>(), *yb = y.data_ptr<float>();
  float* hb = h.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float g = 1.f / (1.f + std::exp(-dot(xb + t * D, gb, D)));
      float* ht = hb + t * D;
      const float* yt = yb + t * D;
      for (int64_t d = 0; d < D; ++d) ht[d] = ht[d] + yt[d] * g;
    }
  });
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  // The stack's routing on its own (engine/layers/moe.py routes with it, so the Python layers
  // and the stack pick the same experts with the same weights): x [T, D], router [E, D] float32
  // -> (weights [T, k] float32, experts [T, k] int64).
  lib.def("moe_route(Tensor x, Tensor router, int k, bool norm) -> (Tensor, Tensor)",
          [](const at::Tensor& x, const at::Tensor& router, int64_t k, bool norm) {
            TORCH_CHECK(x.dim() == 2 && router.dim() == 2 && x.size(1) == router.size(1) &&
                            x.scalar_type() == at::kFloat && router.scalar_type() == at::kFloat,
                        "x [T, D] and router [E, D] must be float32");
            const auto xc = x.contiguous(), rc = router.contiguous();
            auto w = at::empty({x.size(0), k}, x.options()), e = at::empty({x.size(0), k}, x.options().dtype(at::kLong));
            ember::moe_route(xc.data_ptr<float>(), x.size(0), x.size(1), rc.data_ptr<float>(), rc.size(0), k, norm,
                             w.data_ptr<float>(), e.data_ptr<int64_t>());
            return std::make_tuple(w, e);
          });
}
