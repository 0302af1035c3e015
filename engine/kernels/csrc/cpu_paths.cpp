// The code paths and the CPU features each one needs. A path runs only where the CPU has every
// one of them: the paths are not a ladder (Zen 4 and Ice Lake have AVX-512 VNNI and no AVX-VNNI,
// Zen 3 has neither). engine/kernel_paths.py declares the same table in /proc/cpuinfo's
// spelling; tests/kernels/test_cpu_paths.py checks that the two agree with each other and the CPU.
#include <torch/library.h>

#include <string>
#include <vector>

#include "ember.h"

namespace ember {

// /proc/cpuinfo's name -> __builtin_cpu_supports (which takes only a literal, hence the macro).
static bool cpu_has(const std::string& feature) {
  __builtin_cpu_init();
#define FEATURE(info, gcc) \
  if (feature == info) return __builtin_cpu_supports(gcc);
  FEATURE("avx2", "avx2")
  FEATURE("fma", "fma")
  FEATURE("f16c", "f16c")
  FEATURE("avx_vnni", "avxvnni")
  FEATURE("avx512f", "avx512f")
  FEATURE("avx512bw", "avx512bw")
  FEATURE("avx512vl", "avx512vl")
  FEATURE("avx512_vnni", "avx512vnni")
#undef FEATURE
  TORCH_CHECK(false, "unknown CPU feature ", feature);
}

// Every path also runs the AVX2 code shared by all (activation quantization, pointwise ops,
// the tiles' preparation), so each needs AVX2, FMA and F16C.
static const std::vector<std::string>& needs(int64_t path) {
  static const std::vector<std::vector<std::string>> table = {
      {},                                                                             // NONE
      {"avx2", "fma", "f16c"},                                                        // AVX2
      {"avx2", "fma", "f16c", "avx_vnni"},                                            // AVX-VNNI
      {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}};     // AVX-512 VNNI
  TORCH_CHECK(path >= AVX2 && path <= AVX512VNNI, "code path ", path, " does not exist (1 AVX2, 2 AVX-VNNI, ",
              "3 AVX-512 VNNI)");
  return table[path];
}

std::string missing_features(int64_t path) {
  needs(path);  // a path that exists
  static const std::vector<std::string> missing = [] {  // per path, found once: qlinear asks every call
    std::vector<std::string> out(AVX512VNNI + 1);
    for (int64_t p = AVX2; p <= AVX512VNNI; ++p)
      for (const auto& f : needs(p))
        if (!cpu_has(f)) out[p] += (out[p].empty() ? "" : " ") + f;
    return out;
  }();
  return missing[path];
}

void check_path(int64_t path) {
  const std::string missing = missing_features(path);
  TORCH_CHECK(missing.empty(), "code path ", path, " needs CPU features this CPU lacks: ", missing);
}

int64_t best_path() {
  static const int64_t best = [] {
    for (int64_t p = AVX512VNNI; p >= AVX2; --p)
      if (missing_features(p).empty()) return p;
    return int64_t(NONE);
  }();
  return best;
}

static std::string path_features(int64_t path) {
  std::string out;
  for (const auto& f : needs(path)) out += (out.empty() ? "" : " ") + f;
  return out;
}

}  // namespace ember

TORCH_LIBRARY_FRAGMENT(ember, lib) {
  lib.def("best_path() -> int", &ember::best_path);
  lib.def("path_features(int path) -> str", &ember::path_features);
  lib.def("missing_features(int path) -> str", &ember::missing_features);
}
