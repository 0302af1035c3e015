// The 256-bit tile kernels, once per path: ember::avx2 (AVX2, FMA, F16C: what Zen 3 has) and
// ember::avxvnni (the same with AVX-VNNI's vpdpbusd). Each copy is compiled for its own
// instruction set only; tests/kernels/test_kernel_isa.py reads the library's object code to check it.
#pragma once
#include "qtiles.h"

namespace ember {

namespace avx2 {
#define T256 __attribute__((target("avx2,fma,f16c")))
inline constexpr bool VNNI = false;
#include "qtiles_256.h"
#undef T256
}  // namespace avx2

namespace avxvnni {
#define T256 __attribute__((target("avx2,fma,f16c,avxvnni")))
inline constexpr bool VNNI = true;
#include "qtiles_256.h"
#undef T256
}  // namespace avxvnni

}  // namespace ember
