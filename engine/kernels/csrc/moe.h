// A mixture of experts' FFN as one call of the decoder stack (moe.cpp): engine/layers/moe.py's
// forward, the step's rows grouped by expert so that each expert's tiles are read once a step.
#pragma once
#include <ATen/ATen.h>

#include "ember.h"

namespace ember {

// Route T rows of x [T, D] by the float32 router W [E, D]: softmax over the E logits, the k
// largest (ties to the lower expert), divided by their sum when norm. Writes weights [T, k]
// and experts [T, k] in rank order. Every row on its own: the same bits whatever the batch.
void moe_route(const float* x, int64_t T, int64_t D, const float* W, int64_t E, int64_t k, bool norm, float* weights,
               int64_t* experts);

struct MoeFfn {
  at::Tensor router;  // float32 [E, D]
  int64_t k = 0;      // experts a token takes
  bool norm = false;  // renormalise the top k
  int64_t width = 0;  // an expert's intermediate size
  // A shared expert every row takes (Qwen2-MoE's ffn_*_shexp), its output scaled by
  // sigmoid(x . shared_gate): the gate's float32 row [D]; undefined: none.
  at::Tensor shared_gate;
  int64_t shared_width = 0;  // the shared expert's intermediate size
  // The layer's FFN linears: each expert's gate_up and down, then the shared expert's.
  int64_t linears() const { return 2 * router.size(0) + (shared_gate.defined() ? 2 : 0); }
  // x [T, D] -> h [T, D]: the weighted sum of each row's k experts, added in rank order, then
  // the shared expert's gated output. experts: gate_up of expert e at 2e, its down at 2e + 1,
  // the shared expert's at 2E and 2E + 1; scratch: qlinear's, for T rows of max(D, width,
  // shared_width).
  void operator()(const at::Tensor& x, const Linear* experts, int64_t path, bool gelu, at::Tensor& h,
                  at::Tensor& scratch) const;

 private:
  void add_shared(const at::Tensor& x, const Linear* shared, int64_t path, bool gelu, at::Tensor& h,
                  at::Tensor& scratch) const;
};

}  // namespace ember
