// CPU hot loops of the uniform-sparse kernels, compiled for AVX-512, for
// AVX2 + FMA and for baseline x86-64, and picked at run time by CPU
// features (framework-free: no TensorFlow).
//
// uniform_sparse_cpu_loops_impl.h is included three times, in namespaces
// avx512 / avx2 / base inside `#pragma GCC target` regions (so its
// generic-vector code is compiled for each instruction set), and CpuIsa()
// (ops/common/cpu_isa.h: by CPU features, not GCC target_clones' CPU model)
// picks one.  XMC_TF_CPU_ISA=avx512|avx2|base lowers the choice (tests,
// comparisons).
//
// The loops (see the impl header) keep their accumulators in registers:
//  * ForwardLabels: acc[t, :] = sum_k w[t, k] * featT[idx[t, k], :].
//  * GradWeightsDense: g[k] = sum_i col[i] * featT[idx[k], i] for one
//    label's connections, sixteen at a time, reduced by a shuffle tree.
//  * GradFeaturesScatter: gT[idx[k], :] += w[k] * col for one label's
//    connections (the transpose of the forward).
//  * NonZeros: the non-zero entries of a signal row (positions and
//    values), found and compressed a vector at a time.
//  * SparseRow: both gradients' updates from one instance's non-zero
//    signal entries (hardware gathers for the weights gradient).
#ifndef XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_LOOPS_H_
#define XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_LOOPS_H_

#include <cstdint>

#include "ops/common/cpu_isa.h"

#if XMC_CPU_MULTI_ISA
#include <immintrin.h>  // the AVX2 / AVX-512 variants' gathers and masks
#endif

namespace xmc_tf {
namespace cpu_loops {

using ::xmc_tf::cpu::CpuIsa;
using ::xmc_tf::cpu::Isa;
using ::xmc_tf::cpu::IsaName;

// The batch axis padded to whole 16-float vectors.
inline int64_t PaddedBatch(int64_t batch) { return (batch + 15) / 16 * 16; }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

#if XMC_CPU_MULTI_ISA
XMC_CPU_BEGIN_AVX512
namespace avx512 {
#define XMC_CPU_LANES 16
constexpr int kMaxVC = 4;
#include "ops/uniform_sparse/uniform_sparse_cpu_loops_impl.h"
#undef XMC_CPU_LANES
}  // namespace avx512
XMC_CPU_END

XMC_CPU_BEGIN_AVX2
namespace avx2 {
#define XMC_CPU_LANES 8
constexpr int kMaxVC = 2;
#include "ops/uniform_sparse/uniform_sparse_cpu_loops_impl.h"
#undef XMC_CPU_LANES
}  // namespace avx2
XMC_CPU_END
#endif

namespace base {
#define XMC_CPU_LANES 4
constexpr int kMaxVC = 2;
#include "ops/uniform_sparse/uniform_sparse_cpu_loops_impl.h"
#undef XMC_CPU_LANES
}  // namespace base

#pragma GCC diagnostic pop

#if XMC_CPU_MULTI_ISA
#define XMC_CPU_DISPATCH(isa, fn, ...)                             \
  switch (isa) {                                                   \
    case Isa::kAvx512: return avx512::fn(__VA_ARGS__);             \
    case Isa::kAvx2: return avx2::fn(__VA_ARGS__);                 \
    default: return base::fn(__VA_ARGS__);                         \
  }
#else
#define XMC_CPU_DISPATCH(isa, fn, ...) return base::fn(__VA_ARGS__);
#endif

// acc[t, 0:bp] = sum_k w[t, k] * featT[idx[t, k], 0:bp] for t < n (labels
// row-major in idx / w; featT [num_features, bp], padding columns zero).
inline void ForwardLabels(Isa isa, const float* featT, int64_t bp,
                          const int32_t* idx, const float* w, int64_t n,
                          int64_t fan_in, float* acc) {
  XMC_CPU_DISPATCH(isa, ForwardLabels, featT, bp, idx, w, n, fan_in, acc)
}

// gj[k] = sum_{i < bp} col[i] * featT[ij[k], i] for k < fan_in (plain
// products: a zero col[i] against an inf/NaN feature gives NaN).
inline void GradWeightsDense(Isa isa, const float* featT, int64_t bp,
                             const float* col, const int32_t* ij,
                             int64_t fan_in, float* gj) {
  XMC_CPU_DISPATCH(isa, GradWeightsDense, featT, bp, col, ij, fan_in, gj)
}

// gT[ij[k], 0:bp] += wj[k] * col[0:bp] for k < fan_in (plain products: a
// zero col[i] against an inf/NaN weight gives NaN).
inline void GradFeaturesScatter(Isa isa, float* gT, int64_t bp,
                                const float* col, const int32_t* ij,
                                const float* wj, int64_t fan_in) {
  XMC_CPU_DISPATCH(isa, GradFeaturesScatter, gT, bp, col, ij, wj, fan_in)
}

// The non-zero entries of sig[0:n] (+-0 is zero), in order: positions into
// pos, values into val (room for n rounded up to 16 in each); returns
// their number.
inline int64_t NonZeros(Isa isa, const float* sig, int64_t n, int32_t* pos,
                        float* val) {
  XMC_CPU_DISPATCH(isa, NonZeros, sig, n, pos, val)
}

// For one instance's non-zero signal entries (label pos[q] relative to idx /
// w / gw, value val[q], q < count, in order): gw[t * fan_in + k] += val[q] *
// frow[idx[t, k]] when gw is not null, grow[idx[t, k]] += val[q] * w[t, k]
// when grow is not null (t = pos[q], k < fan_in; frow / grow: the
// instance's features and features-gradient rows).  The indices must have
// been range-checked.
inline void SparseRow(Isa isa, const int32_t* pos, const float* val,
                      int64_t count, const int32_t* idx, const float* w,
                      int64_t fan_in, const float* frow, float* gw,
                      float* grow) {
  XMC_CPU_DISPATCH(isa, SparseRow, pos, val, count, idx, w, fan_in, frow, gw,
                   grow)
}

#undef XMC_CPU_DISPATCH

}  // namespace cpu_loops
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_LOOPS_H_
