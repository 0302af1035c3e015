// A whole decoder stack as one op: the forward pass of engine/models/llama.py with every matrix
// quantized, for a flattened batch of decodes and prefill chunks, for every family of
// engine/model_files/families.py (its switches are one Switches struct, set_family's; which
// attention each layer runs is add_layer's).
//
//     h = embed(ids);  per layer:  r = r + h;  x = rms_norm(r) w_in
//                                  q, k, v = split(x Wqkv^T + b);  [q, k = rms_norm per head]
//                                  q, k = rope_l(q), rope_l(k)  (the layer's table, or none)
//                                  K/V pool <- k, v;  o = attention(q, pool, window_l)
//                                  a = o Wo^T;  [a = rms_norm(a) w_ao];  r = r + a
//                                  x = rms_norm(r) w_post
//                                  h = (act(x Wg^T) * x Wu^T) Wd^T;  [h = rms_norm(h) w_mo]
//                                  (or h = the mixture of experts' FFN, moe.cpp)
//     out = rms_norm(r + h) w_final
//
// Python dispatches some 40 small torch ops per layer; at one token per step that costs more
// than the layer's arithmetic. Here the glue runs as plain loops between the kernels (qlinear.cpp,
// paged_attention.cpp). Every step of a row depends on that row alone, so outputs are the same
// whatever the batch, the prompt's chunking or the prefix cache.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <chrono>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "ember.h"
#include "moe.h"
#include "pointwise.h"

namespace ember {
namespace {

using pointwise::add_;
using pointwise::gated_act;
using pointwise::rms_norm;
using pointwise::rms_norm_heads_;
using pointwise::rope_;

// This step's keys (or values) into their pool slots: row t's NKV heads of HD floats at
// src + t * ld, in the pool's type (bf16 and fp16 rounded to nearest even, as torch's .to();
// int8: q8_0 rows, kv_quant.cpp). Plain loops: index_copy_ and .to() took 10 us a layer.
void write_kv(const float* src, int64_t ld, int64_t T, int64_t NKV, int64_t HD, const int64_t* slots, at::Tensor& pool) {
  const int64_t width = pool.size(3), row_bytes = width * pool.element_size();
  const auto dt = pool.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf || dt == at::kChar,
              "KV pool dtype ", dt, " is not supported");
  TORCH_CHECK(width == (dt == at::kChar ? HD + HD / 16 : HD), "KV rows of ", width, " for head_dim ", HD);
  char* base = static_cast<char*>(pool.data_ptr());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < NKV; ++h) {
      const float* x = src + t * ld + h * HD;
      char* dst = base + (slots[t] * NKV + h) * row_bytes;
      if (dt == at::kFloat) std::copy(x, x + HD, reinterpret_cast<float*>(dst));
      else if (dt == at::kBFloat16) std::copy(x, x + HD, reinterpret_cast<at::BFloat16*>(dst));
      else if (dt == at::kHalf) std::copy(x, x + HD, reinterpret_cast<at::Half*>(dst));
      else kv_q8_row(x, HD, reinterpret_cast<int8_t*>(dst));
    }
}

}  // namespace

// The family's switches (engine/model_files/families.py), by the names engine/layers/
// decoder_stack.py's stack_switches gives them: a new switch is a field and a key here and a key
// there. A name missing or unknown is refused, so the two cannot drift apart unseen.
struct Switches {
  bool qk_norm = false;     // RMSNorm over each head of q and k before RoPE
  bool post_norms = false;  // RMSNorm on the attention and MLP outputs before the residual adds
  bool gelu = false;        // activation: 0 SiLU (SwiGLU), 1 GELU-tanh (GeGLU)
  double scale = 0.0;       // softmax(q.k * scale)

  static Switches from(const c10::Dict<std::string, double>& named) {
    static const char* const keys[] = {"qk_norm", "post_norms", "activation", "scale"};
    TORCH_CHECK(named.size() == std::size(keys), "the stack's switches are qk_norm, post_norms, activation and "
                "scale; got ", named.size(), " names");
    const auto get = [&](const char* key) {
      const auto it = named.find(key);
      TORCH_CHECK(it != named.end(), "the stack's switches lack ", key);
      return it->value();
    };
    const double activation = get("activation");
    TORCH_CHECK(activation == 0 || activation == 1, "activation ", activation, " is neither 0 (SiLU) nor 1 (GELU)");
    return {get("qk_norm") != 0, get("post_norms") != 0, activation == 1, get("scale")};
  }
};

struct DecoderStack : torch::CustomClassHolder {
  int64_t H, NKV, HD, D, F;
  double eps;
  int64_t path = 0;
  Switches sw;
  // per layer: qkv, o, then gate_up, down (a mixture: each expert's gate_up, down); `first`:
  // a layer's first, `moe`: its MoeFfn's index in moes (-1: a dense FFN)
  std::vector<Linear> linears;
  std::vector<int64_t> first, moe;
  std::vector<MoeFfn> moes;
  int64_t moe_width = 0;  // the widest expert
  // per layer: input, post-attention, [q, k with qk_norm], [attention out, MLP out with
  // post_norms]; then the final norm
  std::vector<at::Tensor> norms;
  std::vector<int64_t> windows, ropes;  // per layer: window (0 full), RoPE table (-1 none)
  // Seconds spent per phase (PHASES) since set_profile(true), for `ember bench decode`: with the
  // stack one op, no outside profiler sees where a step's time goes.
  bool profile = false;
  std::vector<double> phase_s = std::vector<double>(8, 0.0);

  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t hidden, int64_t inter, double eps_)
      : H(num_heads), NKV(num_kv_heads), HD(head_dim), D(hidden), F(inter), eps(eps_) {
    sw.scale = 1.0 / std::sqrt((double)head_dim);
  }

  void add_linear(at::Tensor qw, at::Tensor d, c10::optional<at::Tensor> m, c10::optional<at::Tensor> bias, int64_t n,
                  int64_t bits, int64_t group, c10::optional<at::Tensor> d_super, c10::optional<at::Tensor> m_super) {
    linears.push_back({qw, d, m, bias, d_super, m_super, n, bits, group});
  }
  void add_norm(at::Tensor w) {
    TORCH_CHECK(w.scalar_type() == at::kFloat && (w.numel() == D || w.numel() == HD),
                "norm weights must be float32 [hidden] or [head_dim]");
    norms.push_back(w.contiguous());
  }
  void set_family(c10::Dict<std::string, double> switches) { sw = Switches::from(switches); }
  void add_layer(int64_t window, int64_t rope) {
    windows.push_back(window), ropes.push_back(rope), first.push_back((int64_t)linears.size()), moe.push_back(-1);
  }
  // This layer's FFN is a mixture: its router [E, D] float32, and a shared expert's gate [D]
  // float32 where it has one (its experts' linears follow, add_linear's, the shared one's last)
  void add_moe(at::Tensor router, int64_t k, bool norm, int64_t width, c10::optional<at::Tensor> shared_gate,
               int64_t shared_width) {
    TORCH_CHECK(!moe.empty() && router.scalar_type() == at::kFloat && router.dim() == 2 && router.size(1) == D,
                "a router is float32 [experts, hidden], after its layer's add_layer");
    TORCH_CHECK(!shared_gate || (shared_gate->scalar_type() == at::kFloat && shared_gate->numel() == D &&
                                 shared_width > 0), "a shared expert's gate is float32 [hidden], its width > 0");
    moe.back() = (int64_t)moes.size(), moe_width = std::max({moe_width, width, shared_width});
    moes.push_back({router.contiguous(), k, norm, width,
                    shared_gate ? shared_gate->contiguous().view({D}) : at::Tensor(), shared_width});
  }
  void set_path(int64_t p) { path = p; }
  void set_profile(bool on) { profile = on, phase_s.assign(phase_s.size(), 0.0); }
  std::vector<double> phases() const { return phase_s; }

  // hidden [T, D] float32 embeddings; C, S: the step's rotation tables [T, HD] (global, then
  // local where the family has one); the pool of every layer; slots [T]; block_tables
  // [num_seqs, *]; seq_lens [num_seqs]; query_start [num_seqs + 1]; the first num_decodes
  // sequences have one query each. Returns the final normed hidden.
  at::Tensor forward(at::Tensor hidden, std::vector<at::Tensor> C, std::vector<at::Tensor> S,
                     std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, at::Tensor slots,
                     at::Tensor block_tables, at::Tensor seq_lens, std::vector<int64_t> query_start,
                     int64_t num_decodes) {
    const int64_t L = (int64_t)windows.size(), T = hidden.size(0), qs = H * HD, kvs = NKV * HD;
    const int64_t per = 2 + 2 * sw.qk_norm + 2 * sw.post_norms;  // norms a layer holds
    TORCH_CHECK((int64_t)norms.size() == per * L + 1 && (int64_t)k_caches.size() == L && (int64_t)v_caches.size() == L
                    && linears.size() >= 4, "the stack has ", L, " layers, ", norms.size(), " norms, ",
                linears.size(), " linears and ", k_caches.size(), " caches");
    for (int64_t l = 0; l < L; ++l) {
      const int64_t end = l + 1 < L ? first[l + 1] : (int64_t)linears.size();
      TORCH_CHECK(end - first[l] == 2 + (moe[l] < 0 ? 2 : moes[moe[l]].linears()), "layer ", l, " has ",
                  end - first[l], " linears");
    }
    TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.size(1) == D, "hidden must be float32 [T, ", D, "]");
    TORCH_CHECK(C.size() == S.size() && !C.empty(), "one S table per C table");
    std::vector<at::Tensor> Cc, Sc;
    for (size_t i = 0; i < C.size(); ++i) {
      Cc.push_back(C[i].reshape({T, HD}).to(at::kFloat).contiguous());
      Sc.push_back(S[i].reshape({T, HD}).to(at::kFloat).contiguous());
    }
    for (int64_t r : ropes) TORCH_CHECK(r < (int64_t)C.size(), "a layer asks for RoPE table ", r, " of ", C.size());
    // Every query row attends on its own, a prefill row at position p as a decode over p + 1
    // tokens: the same kernel and the same bits for a token whether it comes in a prompt chunk
    // of any length, after a cached prefix, or decoded (SDPA's causal and masked paths differ).
    const int64_t nseq = seq_lens.size(0);
    TORCH_CHECK((int64_t)query_start.size() == nseq + 1 && query_start[nseq] == T, "query_start does not match T");
    const auto lens = seq_lens.to(at::kLong).contiguous();
    auto row_seq = at::empty({T}, lens.options()), row_lens = at::empty({T}, lens.options());
    for (int64_t i = 0; i < nseq; ++i) {
      const int64_t s0 = query_start[i], n = query_start[i + 1] - s0, L0 = lens.data_ptr<int64_t>()[i] - n;
      for (int64_t j = 0; j < n; ++j) {
        row_seq.data_ptr<int64_t>()[s0 + j] = i;
        row_lens.data_ptr<int64_t>()[s0 + j] = L0 + j + 1;
      }
    }
    const auto slots_c = slots.to(at::kLong).contiguous();
    const int64_t* slot = slots_c.data_ptr<int64_t>();
    TORCH_CHECK(slots_c.numel() == T, "slots must have one entry a row");
    int64_t pool_rows = INT64_MAX;  // checked here: write_kv trusts every slot
    for (int64_t l = 0; l < L; ++l) {
      TORCH_CHECK(k_caches[l].dim() == 4 && k_caches[l].size(2) == NKV && k_caches[l].is_contiguous() &&
                      v_caches[l].sizes() == k_caches[l].sizes() && v_caches[l].is_contiguous(),
                  "layer ", l, "'s pools must be contiguous [blocks, block_size, ", NKV, ", width], alike");
      pool_rows = std::min(pool_rows, k_caches[l].size(0) * k_caches[l].size(1));
    }
    for (int64_t t = 0; t < T; ++t)
      TORCH_CHECK(slot[t] >= 0 && slot[t] < pool_rows, "slot ", slot[t], " is outside the pool");
    const auto row_tables = num_decodes == nseq ? block_tables : block_tables.index_select(0, row_seq);
    auto residual = hidden.contiguous().clone();
    auto x = at::empty_like(residual);
    // One buffer per product for every layer: at one token a step, allocating them layer by
    // layer cost more than some of the products.
    const auto f32 = x.options();
    auto qkv = at::empty({T, linears[0].n}, f32), attn = at::empty({T, linears[1].n}, f32);
    auto gu = at::empty({T, linears[2].n}, f32), act = at::empty({T, F}, f32), h = at::empty({T, linears[3].n}, f32);
    auto q = at::empty({T, H, HD}, f32);
    auto scratch = at::empty({qlinear_scratch_bytes(T, std::max({D, F, qs, moe_width}))}, f32.dtype(at::kByte));
    // phases: 0 norms and residual adds, 1 qkv, 2 RoPE and the KV writes, 3 attention, 4 o,
    // 5 gate_up and the activation, 6 down, 7 a mixture's FFN
    using clock = std::chrono::steady_clock;
    auto t_last = clock::now();
    const auto phase = [&](int i) {
      if (!profile) return;
      const auto t = clock::now();
      phase_s[i] += std::chrono::duration<double>(t - t_last).count();
      t_last = t;
    };
    for (int64_t l = 0; l < L; ++l) {
      const at::Tensor* nl = &norms[per * l];  // input, post-attention, [q, k], [attention out, MLP out]
      const Linear* lin = &linears[first[l]];
      if (l) add_(residual.data_ptr<float>(), h.data_ptr<float>(), T * D);
      rms_norm(residual.data_ptr<float>(), nl[0].data_ptr<float>(), x.data_ptr<float>(), T, D, (float)eps);
      phase(0);
      lin[0](x, path, qkv, scratch);  // [T, qs + 2 kvs]
      phase(1);
      if (sw.qk_norm)
        rms_norm_heads_(qkv.data_ptr<float>(), qkv.size(1), nl[2].data_ptr<float>(), nl[3].data_ptr<float>(), T,
                        H + NKV, NKV, HD, (float)eps);
      if (const int64_t r = ropes[l]; r >= 0)
        rope_(qkv.data_ptr<float>(), qkv.size(1), Cc[r].data_ptr<float>(), Sc[r].data_ptr<float>(), T, H + NKV, HD);
      const float* qkvb = qkv.data_ptr<float>();
      const int64_t ld = qkv.size(1);
      for (int64_t t = 0; t < T; ++t) std::copy(qkvb + t * ld, qkvb + t * ld + qs, q.data_ptr<float>() + t * qs);
      write_kv(qkvb + qs, ld, T, NKV, HD, slot, k_caches[l]);
      write_kv(qkvb + qs + kvs, ld, T, NKV, HD, slot, v_caches[l]);
      phase(2);
      auto o = paged_attention_decode(q, k_caches[l], v_caches[l], row_tables, row_lens, sw.scale, path, windows[l]);
      phase(3);
      lin[1](o.view({T, qs}), path, attn, scratch);
      phase(4);
      const at::Tensor* post = nl + 2 + 2 * sw.qk_norm;  // attention out, MLP out
      if (sw.post_norms)  // in place: a row's sum of squares is taken before its first write
        rms_norm(attn.data_ptr<float>(), post[0].data_ptr<float>(), attn.data_ptr<float>(), T, D, (float)eps);
      add_(residual.data_ptr<float>(), attn.data_ptr<float>(), T * D);
      rms_norm(residual.data_ptr<float>(), nl[1].data_ptr<float>(), x.data_ptr<float>(), T, D, (float)eps);
      phase(0);
      if (moe[l] >= 0) {
        moes[moe[l]](x, lin + 2, path, sw.gelu, h, scratch);
        phase(7);
      } else {
        lin[2](x, path, gu, scratch);
        gated_act(gu.data_ptr<float>(), act.data_ptr<float>(), T, F, sw.gelu);
        phase(5);
        lin[3](act, path, h, scratch);
        phase(6);
      }
      if (sw.post_norms)
        rms_norm(h.data_ptr<float>(), post[1].data_ptr<float>(), h.data_ptr<float>(), T, D, (float)eps);
    }
    add_(residual.data_ptr<float>(), h.data_ptr<float>(), T * D);
    rms_norm(residual.data_ptr<float>(), norms[per * L].data_ptr<float>(), x.data_ptr<float>(), T, D, (float)eps);
    phase(0);
    return x;
  }
};

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  // The stack's SwiGLU / GeGLU on its own: [T, 2f] gate | up -> [T, f] (tests/kernels/test_pointwise_kernels.py)
  lib.def("gated_act(Tensor gate_up, bool gelu) -> Tensor", [](const at::Tensor& gu, bool gelu) {
    TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == at::kFloat && gu.size(1) % 2 == 0,
                "gate_up must be float32 [T, 2f]");
    const auto x = gu.contiguous();
    auto y = at::empty({x.size(0), x.size(1) / 2}, x.options());
    ember::pointwise::gated_act(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1) / 2, gelu);
    return y;
  });
  lib.class_<ember::DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, double>())
      .def("add_linear", &ember::DecoderStack::add_linear)
      .def("add_norm", &ember::DecoderStack::add_norm)
      .def("set_path", &ember::DecoderStack::set_path)
      .def("set_profile", &ember::DecoderStack::set_profile)
      .def("phases", &ember::DecoderStack::phases)
      .def("set_family", &ember::DecoderStack::set_family)
      .def("add_layer", &ember::DecoderStack::add_layer)
      .def("add_moe", &ember::DecoderStack::add_moe)
      .def("forward", &ember::DecoderStack::forward);
}
