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
// Layouts (built by engine/kernels/tiles.py, columns padded to a multiple of 16):
//   4-bit: qw uint8 [N/16, K/32, 4, 64]; chunk g byte 4c+j holds column c's weights
//          k = 4g+j (low nibble) and k = 16+4g+j (high nibble) of the block; d, m [N/16, K/32, 16].
//   8-bit: qw int8 [N/16, K/4, 64]; byte 4c+j of k-group t is column c's weight 4t+j;
//          d (and m, optional) [N/16, K/G, 16].
//   6-bit: 8-bit codes in -32..31 stored in 6 bits, [N/16, K/32, 6, 64] (qformats.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ember.h"
#include "qtiles.h"
#include "qtiles_avx2.h"

namespace ember {

// ---- dispatch -----------------------------------------------------------------------------

// (tile, scales, mins, activations, row0, y, ldy, bias, ncols, the prepared tile's extra data)
using TileFn = void (*)(const void*, const void*, const void*, const Acts&, int64_t, float*, int64_t,
                        const float*, int, const void*);

// The tile kernel for rows in chunks of R, for one format, scale type and path; U: on a
// prepared tile (prepares() says which formats and paths have one); B6: 6-bit storage.
template <int R, bool U, bool B6, typename S>
static TileFn tile_fn(int64_t path, int64_t bits, int64_t group, bool has_min) {
#define AS(f) reinterpret_cast<TileFn>(&f)
#define W8(K, ...) (group == 16 ? (has_min ? AS((K<R2, 16, true, ##__VA_ARGS__, S>)) : AS((K<R2, 16, false, ##__VA_ARGS__, S>))) \
                                : (has_min ? AS((K<R2, 32, true, ##__VA_ARGS__, S>)) : AS((K<R2, 32, false, ##__VA_ARGS__, S>))))
  if (path == AVX512VNNI) {
    constexpr int R2 = R;
    return bits == 4 ? AS((w4_512<R, U, S>)) : B6 ? W8(w6_512) : W8(w8_512, U);
  }
  constexpr int R2 = R > 4 ? 4 : R;  // 16 ymm registers: at most 4 rows at a time
  // a prepared 8-bit tile on these paths is a 6-bit one (U)
  if (path == AVXVNNI)
    return bits == 4 ? AS((avxvnni::w4_256<R2, U, S>)) : B6 ? W8(avxvnni::w6_256) : W8(avxvnni::w8_256, U);
  return bits == 4 ? AS((avx2::w4_256<R2, U, S>)) : B6 ? W8(avx2::w6_256) : W8(avx2::w8_256, U);
#undef W8
#undef AS
}

template <bool U, bool B6, typename S>
static void tile_fns(TileFn* fns, int64_t path, int64_t bits, int64_t group, bool has_min) {
  fns[0] = tile_fn<8, U, B6, S>(path, bits, group, has_min), fns[1] = tile_fn<4, U, B6, S>(path, bits, group, has_min);
  fns[2] = tile_fn<2, U, B6, S>(path, bits, group, has_min), fns[3] = tile_fn<1, U, B6, S>(path, bits, group, has_min);
}

// A prepared tile's K-quant group scales (or mins) as float32 [groups, 16]: the kernels' own
// products (scale8's single rounding, so the same bits), once per tile instead of once per row chunk.
__attribute__((target("avx2,fma,f16c"))) static void kscales_f32(const KScales& k, int64_t groups, float* out) {
  for (int64_t g = 0; g < groups; ++g)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + g * 16 + h * 8, avx2::scale8(&k, g, h));
}

// Many rows: each tile is prepared once per call for all of them (4-bit: nibbles unpacked to
// bytes; 6-bit: to the 8-bit layout; 8-bit on AVX-512: the sums' start), which takes work out
// of every row's inner loop.
static bool prepares(int64_t path, int64_t bits, size_t chunks) {
  return chunks >= 3 && (bits != 8 || path == AVX512VNNI);
}

// The kernels of a call: a prepared 6-bit tile is an 8-bit one (signed for AVX-512's kernel,
// w + 32 for the AVX2 ones: prepare_w6).
template <typename S>
static void select_fns(TileFn* fns, int64_t path, int64_t bits, int64_t group, bool has_min, bool prep) {
  if (bits == 6) return prep ? tile_fns<true, false, S>(fns, path, 8, group, has_min)
                             : tile_fns<false, true, S>(fns, path, 8, group, has_min);
  if (prep) return tile_fns<true, false, S>(fns, path, bits, group, has_min);
  tile_fns<false, false, S>(fns, path, bits, group, has_min);
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   const c10::optional<at::Tensor>& bias, int64_t n, int64_t bits, int64_t group, int64_t path,
                   const c10::optional<at::Tensor>& d_super, const c10::optional<at::Tensor>& m_super,
                   at::Tensor* out, at::Tensor* scratch) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), NT = (n + 15) / 16;
  TORCH_CHECK(K % 32 == 0, "K = ", K, " is not a multiple of 32");
  TORCH_CHECK(bits == 4 ? group == 32 : ((bits == 6 || bits == 8) && (group == 16 || group == 32)),
              "unsupported format: ", bits, "-bit, group ", group);
  TORCH_CHECK(qw.numel() == NT * K * bits / 8 * 16, "packed weight has ", qw.numel(), " bytes, expected ",
              NT * K * bits / 8 * 16);
  const bool half = d.scalar_type() == at::kHalf, has_min = m.has_value() && m->defined();
  const bool ksup = d_super.has_value() && d_super->defined();
  TORCH_CHECK((half || d.scalar_type() == at::kFloat || (ksup && d.scalar_type() == at::kChar)) &&
                  d.numel() == NT * (K / group) * 16,
              "scales must be float32 or float16 [N/16, K/G, 16] (int8 codes with d_super)");
  TORCH_CHECK(!has_min || m->scalar_type() == d.scalar_type(), "mins must have the scales' dtype");
  TORCH_CHECK(!ksup || (K % 256 == 0 && d_super->scalar_type() == at::kHalf && d_super->numel() == NT * (K / 256) * 16 &&
                        (!has_min || (m_super.has_value() && m_super->numel() == d_super->numel()))),
              "super-block scales must be float16 [N/16, K/256, 16], for the mins too");
  TORCH_CHECK(bits != 4 || has_min, "4-bit weights need mins");
  if (path == 0) path = best_path();
  check_path(path);
  auto y = out ? *out : at::empty({M, n}, x.options());
  TORCH_CHECK(!out || (y.scalar_type() == at::kFloat && y.is_contiguous() && y.numel() == M * n), "out must be float32 [M, n]");
  if (M == 0) return y;
  // Rows in chunks of 8 (AVX-512; 4 on 16 registers), then 4, 2, 1: each its kernel, the same ops.
  const int chunk[4] = {path == AVX512VNNI ? 8 : 4, 4, 2, 1};
  std::vector<RowChunk> chunks;
  for (int64_t row = 0, k = 0; k < 4; ++k)
    for (; M - row >= chunk[k]; row += chunk[k]) chunks.push_back({row, chunk[k]});
  // The int8 activations in one allocation (the caller's scratch, or a new one), twice over for
  // many rows (then the chunk layout): at one row, allocations cost more than quantizing.
  const int64_t KB = K / 32, need = qlinear_scratch_bytes(M, K), act_bytes = M * (K + KB * 16);  // q, s, sm, sum16
  TORCH_CHECK(!scratch || (scratch->scalar_type() == at::kByte && scratch->numel() >= need), "scratch needs ", need, " bytes");
  auto acts = scratch ? *scratch : at::empty({need}, x.options().dtype(at::kByte));
  const auto carve = [&](uint8_t* p) {
    return std::make_tuple(reinterpret_cast<int8_t*>(p), reinterpret_cast<float*>(p + M * K),
                           reinterpret_cast<float*>(p + M * K + M * KB * 4), reinterpret_cast<int32_t*>(p + M * K + M * KB * 8));
  };
  auto [q, s, sm, sum16] = carve(acts.data_ptr<uint8_t>());
  quantize_rows(x.data_ptr<float>(), M, K, q, s, sm, sum16);
  if (M > 1) {  // one row is its own chunk layout already
    const auto [qi, si, smi, s16i] = carve(acts.data_ptr<uint8_t>() + act_bytes);
    interleave_rows(q, s, sm, sum16, K, chunks, qi, si, smi, s16i);
    q = qi, s = si, sm = smi, sum16 = s16i;
  }
  const bool prep = prepares(path, bits, chunks.size());
  at::Tensor qu;  // prepared 8-bit tiles take the codes as q + 128
  const bool prep8 = prep && bits != 4 && path == AVX512VNNI;  // the 8-bit U kernel: sums from wsum
  if (prep8) qu = at::bitwise_xor(at::from_blob(q, {M * K}, x.options().dtype(at::kByte)), 0x80);
  const Acts a{q, s, sm, sum16, K, qu.defined() ? qu.data_ptr<uint8_t>() : nullptr};
  TileFn fns[4];
  // A prepared K-quant tile takes its group scales as float32 (kscales_f32).
  const bool kflat = ksup && prep;
  if (kflat) select_fns<float>(fns, path, bits, group, has_min, prep);
  else if (ksup) select_fns<KScales>(fns, path, bits, group, has_min, prep);
  else if (half) select_fns<at::Half>(fns, path, bits, group, has_min, prep);
  else select_fns<float>(fns, path, bits, group, has_min, prep);
  const auto* qb = static_cast<const uint8_t*>(qw.data_ptr());
  const auto* db = static_cast<const char*>(d.data_ptr());
  const auto* mb = has_min ? static_cast<const char*>(m->data_ptr()) : nullptr;
  const float* bb = bias.has_value() && bias->defined() ? bias->data_ptr<float>() : nullptr;
  float* yb = y.data_ptr<float>();
  const at::Half* dsup = ksup ? d_super->data_ptr<at::Half>() : nullptr;
  const at::Half* msup = ksup && has_min ? m_super->data_ptr<at::Half>() : nullptr;
  const int64_t tile_bytes = K * bits / 8 * 16, tile_scales = (K / group) * 16 * d.element_size();
  at::parallel_for(0, NT, 1, [&](int64_t t0, int64_t t1) {
    // per thread: the prepared tile (4- and 6-bit: K * 16 bytes), then the 8-bit sums' start
    const int64_t wsum_at = bits == 8 ? 0 : K * 16;
    std::vector<uint8_t> prepared(prep ? wsum_at + (prep8 ? K / group * 16 * 4 : 0) : 0);
    std::vector<float> kd(kflat ? K / group * 16 : 0), km(kflat && has_min ? K / group * 16 : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int ncols = (int)std::min<int64_t>(16, n - t * 16);
      const uint8_t* tile = qb + t * tile_bytes;
      const void* aux = nullptr;
      if (prep && bits == 4) prepare_w4(tile, K, prepared.data());
      if (prep && bits == 6) prepare_w6(tile, K, (int8_t*)prepared.data(), path == AVX512VNNI ? 0 : 32);
      if (prep && bits != 8) tile = prepared.data();
      if (prep8) prepare_w8((const int8_t*)tile, K, group, (int32_t*)(prepared.data() + wsum_at)), aux = prepared.data() + wsum_at;
      // the tile's scales and mins, as its kernels take them
      const void* dt = db + t * tile_scales;
      const void* mt = has_min ? mb + t * tile_scales : nullptr;
      KScales dk{}, mk{};
      if (ksup) {  // its super-block scales and its codes
        const int64_t sup = t * (K / 256) * 16, shift = group == 16 ? 4 : 3;  // log2(256 / group)
        dk = {dsup + sup, (const int8_t*)dt, shift}, mk = {msup ? msup + sup : nullptr, (const int8_t*)mt, shift};
        dt = &dk, mt = has_min ? &mk : nullptr;
      }
      if (kflat) {
        kscales_f32(dk, K / group, kd.data()), dt = kd.data();
        if (has_min) kscales_f32(mk, K / group, km.data()), mt = km.data();
      }
      for (const RowChunk& rc : chunks) {
        const TileFn fn = fns[rc.rows == chunk[0] ? 0 : rc.rows == 4 ? 1 : rc.rows == 2 ? 2 : 3];
        fn(tile, dt, mt, a, rc.row0, yb + t * 16, n, bb ? bb + t * 16 : nullptr, ncols, aux);
      }
    }
  });
  return y;
}

}  // namespace ember

// The contract of these ops (tile formats, arguments), checked by engine/kernels/__init__.py's
// ABI: 2 = 6-bit tiles, q8_0 KV rows; 3 = each path checked against its own CPU features;
// 4 = sliding windows, per-head norms, GeGLU and per-layer RoPE in the decoder stack;
// 5 = the decoder stack's family switches as one struct, by name (DecoderStack.set_family);
// 6 = mixtures of experts in the decoder stack (DecoderStack.add_moe, moe_route).
static int64_t abi() { return 7; }

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("abi() -> int", &abi);
  lib.def("qlinear(Tensor x, Tensor qw, Tensor d, Tensor? m, Tensor? bias, int n, int bits, int group, int path, "
          "Tensor? d_super=None, Tensor? m_super=None) -> Tensor");
  lib.impl("qlinear", c10::DispatchKey::CPU,
           [](const at::Tensor& x, const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m,
              const c10::optional<at::Tensor>& bias, int64_t n, int64_t bits, int64_t group, int64_t path,
              const c10::optional<at::Tensor>& d_super, const c10::optional<at::Tensor>& m_super) {
             return ember::qlinear(x, qw, d, m, bias, n, bits, group, path, d_super, m_super);
           });
}
