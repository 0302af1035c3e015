// Rows of a packed quantized weight read back as float32: the embedding lookup of a tied head.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ember.h"
#include "qformats.h"

namespace ember {

// Rows of the weight, dequantized (w = d q + m): the embedding lookup of a tied, quantized head.
// `dq(si, g, t)` and `mq(...)` give column si's scale and min (si indexes the tile-major scales,
// g the group, t the tile); mq is null without mins.
template <class D, class Mn>
static void dequant_rows(const uint8_t* qb, D dq, Mn mq, bool has_min, const int64_t* id, int64_t R, int64_t k,
                         int64_t bits, int64_t group, int64_t n_tiles, float* y) {
  const int64_t tile_bytes = k * bits / 8 * 16, tile_scales = (k / group) * 16;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = id[r] / 16, c = id[r] % 16;
    TORCH_CHECK(id[r] >= 0 && t < n_tiles, "row ", id[r], " is out of range");
    float* out = y + r * k;
    for (int64_t i = 0; i < k; ++i) {
      int q;
      if (bits == 4) {
        const int64_t b = i / 32, j = i % 32, g = (j % 16) / 4;
        const uint8_t byte = qb[t * tile_bytes + b * 256 + g * 64 + c * 4 + j % 4];
        q = j < 16 ? byte & 15 : byte >> 4;
      } else if (bits == 6) {  // k-group (i % 32) / 4 of block i / 32 (qformats.h)
        q = w6_code(qb + t * tile_bytes + i / 32 * 384, (int)(i % 32 / 4), c * 4 + i % 4);
      } else {
        q = (int8_t)qb[t * tile_bytes + (i / 4) * 64 + c * 4 + i % 4];
      }
      const int64_t g = i / group, si = t * tile_scales + g * 16 + c;
      out[i] = has_min ? dq(si, g, t, c) * (float)q + mq(si, g, t, c) : dq(si, g, t, c) * (float)q;
    }
  }
}

at::Tensor qrows(const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m, const at::Tensor& ids,
                 int64_t k, int64_t bits, int64_t group, const c10::optional<at::Tensor>& d_super,
                 const c10::optional<at::Tensor>& m_super, int64_t n) {
  auto ids64 = ids.to(at::kLong).contiguous();
  if (n >= 0 && ids64.numel()) {  // past N but inside the last tile's padding would read zeros
    const int64_t hi = ids64.max().item<int64_t>();
    TORCH_CHECK(hi < n, "row ", hi, " is out of range (", n, " rows)");
  }
  auto y = at::empty({ids64.numel(), k}, qw.options().dtype(at::kFloat));
  const bool has_min = m.has_value() && m->defined();
  const auto* qb = static_cast<const uint8_t*>(qw.data_ptr());
  const int64_t n_tiles = d.numel() / ((k / group) * 16), R = ids64.numel();
  const int64_t* id = ids64.data_ptr<int64_t>();
  float* out = y.data_ptr<float>();
  if (d_super.has_value() && d_super->defined()) {  // K-quants: float16 super-block scale * 8-bit code
    const int64_t per = 256 / group;
    const at::Half* ds = d_super->data_ptr<at::Half>();
    const at::Half* ms = has_min ? m_super->data_ptr<at::Half>() : nullptr;
    const int8_t *dc = d.data_ptr<int8_t>(), *mc = has_min ? m->data_ptr<int8_t>() : nullptr;
    auto kd = [&](int64_t si, int64_t g, int64_t t, int64_t c) {
      return (float)ds[(t * (k / 256) + g / per) * 16 + c] * (float)dc[si];
    };
    auto km = [&](int64_t si, int64_t g, int64_t t, int64_t c) {
      return (float)ms[(t * (k / 256) + g / per) * 16 + c] * (float)mc[si];
    };
    dequant_rows(qb, kd, km, has_min, id, R, k, bits, group, n_tiles, out);
  } else if (d.scalar_type() == at::kHalf) {
    const at::Half *db = d.data_ptr<at::Half>(), *mb = has_min ? m->data_ptr<at::Half>() : nullptr;
    dequant_rows(qb, [&](int64_t si, int64_t, int64_t, int64_t) { return (float)db[si]; },
                 [&](int64_t si, int64_t, int64_t, int64_t) { return (float)mb[si]; }, has_min, id, R, k, bits, group,
                 n_tiles, out);
  } else {
    const float *db = d.data_ptr<float>(), *mb = has_min ? m->data_ptr<float>() : nullptr;
    dequant_rows(qb, [&](int64_t si, int64_t, int64_t, int64_t) { return db[si]; },
                 [&](int64_t si, int64_t, int64_t, int64_t) { return mb[si]; }, has_min, id, R, k, bits, group,
                 n_tiles, out);
  }
  return y;
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("qrows(Tensor qw, Tensor d, Tensor? m, Tensor ids, int k, int bits, int group, Tensor? d_super=None, "
          "Tensor? m_super=None, int n=-1) -> Tensor");
  lib.impl("qrows", c10::DispatchKey::CPU, &ember::qrows);
}
