// The instruction set of the CPU hot loops, picked at run time by CPU
// *features* (framework-free: no TensorFlow).  Shared by the uniform-sparse
// loops (ops/uniform_sparse/uniform_sparse_cpu_loops.h), the LSH hash
// functions (ops/lsh/lsh_hash_functions.cc) and the sampled-scoring CPU
// functors (ops/sampled/sampled_cpu.cc).
//
// Why not GCC's target_clones("arch=haswell", "default"): its resolver picks
// an `arch=` clone by CPU *model* (__builtin_cpu_is), so on AMD CPUs (and
// Intel ones that are not "haswell") the baseline SSE2 clone ran.  A kernel
// file compiles its loops once per instruction set (a `#pragma GCC target`
// region per variant: XMC_CPU_BEGIN_AVX512 / _AVX2 ... XMC_CPU_END) and
// dispatches on CpuIsa(), which reads __builtin_cpu_supports once.
// XMC_TF_CPU_ISA=avx512|avx2|base lowers the choice (tests, comparisons);
// it is read on every call, so call CpuIsa() once per kernel invocation,
// not in a hot loop.
#ifndef XMC_TF_OPS_COMMON_CPU_ISA_H_
#define XMC_TF_OPS_COMMON_CPU_ISA_H_

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// Variants for AVX-512 and AVX2 + FMA are compiled (GCC on x86-64).
#define XMC_CPU_MULTI_ISA 1
#else
#define XMC_CPU_MULTI_ISA 0
#endif

// Regions compiled for one variant: XMC_CPU_BEGIN_AVX512 (or _AVX2) ...
// XMC_CPU_END around code (a namespace of the variant's loops).
#define XMC_CPU_BEGIN_AVX512 \
  _Pragma("GCC push_options")  \
  _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx2,fma\")")
#define XMC_CPU_BEGIN_AVX2    \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx2,fma\")")
#define XMC_CPU_END _Pragma("GCC pop_options")

namespace xmc_tf {
namespace cpu {

enum class Isa { kBase = 0, kAvx2 = 1, kAvx512 = 2 };

// The best instruction set of this CPU (detected once), lowered by
// XMC_TF_CPU_ISA (read on every call, so a test can switch it).
inline Isa CpuIsa() {
#if XMC_CPU_MULTI_ISA
  static const Isa detected = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma")) {
      return Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return Isa::kAvx2;
    }
    return Isa::kBase;
  }();
  Isa isa = detected;
  if (const char* env = std::getenv("XMC_TF_CPU_ISA")) {
    Isa want = isa;
    if (std::strcmp(env, "base") == 0) want = Isa::kBase;
    if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
    if (static_cast<int>(want) < static_cast<int>(isa)) isa = want;
  }
  return isa;
#else
  return Isa::kBase;
#endif
}

inline const char* IsaName(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : isa == Isa::kAvx2 ? "avx2" : "base";
}

}  // namespace cpu
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_CPU_ISA_H_
