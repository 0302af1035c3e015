// The ops one kernel file calls from another (each is also a torch op of the `ember` library).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace ember {

// The SIMD code paths (engine/kernel_paths.py's CpuPath) and the CPU features they need
// (cpu_paths.cpp): a path runs only where the CPU has all of them.
enum Path : int64_t { NONE = 0, AVX2 = 1, AVXVNNI = 2, AVX512VNNI = 3 };
int64_t best_path();                          // the fastest path this CPU runs, NONE without AVX2
std::string missing_features(int64_t path);  // what this CPU lacks for it ("" when it runs)
void check_path(int64_t path);               // refuses a path this CPU cannot run, naming what it lacks

// x [M, K] float32 -> int8 codes q [M, K], scales s and min factors sm [M, K/32], sums [M, K/16].
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* s, float* sm, int32_t* sum16);

// Rows row0 .. row0 + rows - 1, taken by one tile kernel call.
struct RowChunk {
  int64_t row0, rows;
};
// The same activations chunk by chunk, in the layout qtiles.h's kernels read.
void interleave_rows(const int8_t* q, const float* s, const float* sm, const int32_t* sum16, int64_t K,
                     const std::vector<RowChunk>& chunks, int8_t* qi, float* si, float* smi, int32_t* sum16i);

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qw, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   const c10::optional<at::Tensor>& bias, int64_t n, int64_t bits, int64_t group, int64_t path,
                   const c10::optional<at::Tensor>& d_super, const c10::optional<at::Tensor>& m_super,
                   at::Tensor* out = nullptr, at::Tensor* scratch = nullptr);
// One quantized matrix of the decoder stack, as qlinear takes it.
struct Linear {
  at::Tensor qw, d;
  c10::optional<at::Tensor> m, bias, d_super, m_super;
  int64_t n, bits, group;
  // into out [T, n], with the step's scratch for the int8 activations
  void operator()(const at::Tensor& x, int64_t path, at::Tensor& out, at::Tensor& scratch) const {
    qlinear(x, qw, d, m, bias, n, bits, group, path, d_super, m_super, &out, &scratch);
  }
};
// The bytes of qlinear's scratch for M rows of K (its int8 activations).
inline int64_t qlinear_scratch_bytes(int64_t M, int64_t K) { return (M > 1 ? 2 : 1) * M * (K + K / 32 * 16); }

// float [..., D] -> q8_0 rows int8 [..., D + D/16] (kv_quant.cpp), and back; one row of D.
void kv_q8_row(const float* x, int64_t D, int8_t* out);
at::Tensor kv_q8(const at::Tensor& x);
at::Tensor kv_q8_dequant(const at::Tensor& rows);

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t path, int64_t window = 0,
                                  const c10::optional<at::Tensor>& sinks = c10::nullopt);

}  // namespace ember
