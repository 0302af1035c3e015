// The 8-bit KV cache (llama.cpp's q8_0 cache type): every head's row of D values is stored as
// D int8 codes followed by D/32 float16 scales, so a row stays one contiguous piece of the pool
// and the attention kernel widens it like a bf16 row (paged_attention.cpp, Kind Q8). Per block
// of 32: d = max|x| / 127, q = round(x / d) (ties to even), d kept as float16, x ~ q d16, as
// ggml's quantize_row_q8_0 (which rounds ties away from zero: a tie is a measure-zero event).
// 1 + 1/16 bytes a value instead of 2 (bf16) or 4.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ember.h"

namespace ember {

void kv_q8_row(const float* x, int64_t D, int8_t* out) {
  for (int64_t b = 0; b < D / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f, id = d > 0 ? 1.f / d : 0.f;
    for (int i = 0; i < 32; ++i) out[32 * b + i] = (int8_t)std::clamp(std::nearbyint(xb[i] * id), -127.f, 127.f);
    const at::Half d16(d);  // round to nearest even, as torch's .to(float16)
    std::memcpy(out + D + 2 * b, &d16, sizeof d16);
  }
}

at::Tensor kv_q8(const at::Tensor& x) {
  const int64_t D = x.size(-1);
  TORCH_CHECK(D % 32 == 0, "q8_0 rows need a multiple of 32 values, not ", D);
  auto shape = x.sizes().vec();
  shape.back() = D + D / 16;
  const auto xf = x.to(at::kFloat).contiguous();
  auto rows = at::empty(shape, x.options().dtype(at::kChar));
  const int64_t n = D ? xf.numel() / D : 0;
  for (int64_t r = 0; r < n; ++r) kv_q8_row(xf.data_ptr<float>() + r * D, D, rows.data_ptr<int8_t>() + r * (D + D / 16));
  return rows;
}

at::Tensor kv_q8_dequant(const at::Tensor& rows) {
  const int64_t W = rows.size(-1), D = W / 17 * 16;
  TORCH_CHECK(rows.scalar_type() == at::kChar && D % 32 == 0 && D + D / 16 == W,
              "q8_0 rows are int8 [..., D + D/16] with D a multiple of 32, got ", rows.scalar_type(), " ", rows.sizes());
  auto shape = rows.sizes().vec();
  const auto r = rows.contiguous().view({-1, W});
  const auto q = r.narrow(1, 0, D).to(at::kFloat).view({-1, D / 32, 32});
  const auto s = r.narrow(1, D, D / 16).contiguous().view(at::kHalf).to(at::kFloat).view({-1, D / 32, 1});
  shape.back() = D;
  return (q * s).view(shape);
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("kv_q8(Tensor x) -> Tensor");
  lib.impl("kv_q8", c10::DispatchKey::CPU, &ember::kv_q8);
  lib.def("kv_q8_dequant(Tensor rows) -> Tensor");
  lib.impl("kv_q8_dequant", c10::DispatchKey::CPU, &ember::kv_q8_dequant);
}
