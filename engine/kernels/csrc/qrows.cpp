// Rows of a packed quantized weight read back as float32: the embedding lookup of a tied head.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ember.h"

namespace ember {

// Rows of the weight, dequantized (w = d q + m): the embedding lookup of a tied, quantized head.
template <typename S>
static void dequant_rows(const uint8_t* qb, const S* db, const S* mb, const int64_t* id, int64_t R, int64_t k,
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
      } else {
        q = (int8_t)qb[t * tile_bytes + (i / 4) * 64 + c * 4 + i % 4];
      }
      const int64_t si = t * tile_scales + (i / group) * 16 + c;
      out[i] = mb ? (float)db[si] * (float)q + (float)mb[si] : (float)db[si] * (float)q;
    }
  }
}

at::Tensor qrows(const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m, const at::Tensor& ids,
                 int64_t k, int64_t bits, int64_t group) {
  auto ids64 = ids.to(at::kLong).contiguous();
  auto y = at::empty({ids64.numel(), k}, d.options().dtype(at::kFloat));
  const bool has_min = m.has_value() && m->defined();
  const auto* qb = static_cast<const uint8_t*>(qw.data_ptr());
  const int64_t n_tiles = d.numel() / ((k / group) * 16);
  if (d.scalar_type() == at::kHalf)
    dequant_rows<at::Half>(qb, d.data_ptr<at::Half>(), has_min ? m->data_ptr<at::Half>() : nullptr,
                           ids64.data_ptr<int64_t>(), ids64.numel(), k, bits, group, n_tiles, y.data_ptr<float>());
  else
    dequant_rows<float>(qb, d.data_ptr<float>(), has_min ? m->data_ptr<float>() : nullptr, ids64.data_ptr<int64_t>(),
                        ids64.numel(), k, bits, group, n_tiles, y.data_ptr<float>());
  return y;
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("qrows(Tensor qw, Tensor d, Tensor? m, Tensor ids, int k, int bits, int group) -> Tensor");
  lib.impl("qrows", c10::DispatchKey::CPU, &ember::qrows);
}
