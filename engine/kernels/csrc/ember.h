// The ops one kernel file calls from another (each is also a torch op of the `ember` library).
#pragma once
#include <ATen/ATen.h>

namespace ember {

int64_t best_path();  // 0 none, 1 AVX2, 2 AVX-VNNI, 3 AVX-512 VNNI

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   const c10::optional<at::Tensor>& bias, int64_t n, int64_t bits, int64_t group, int64_t path);

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t path);

}  // namespace ember
