// Helpers shared by the CPU translation units of the uniform-sparse kernels
// (TensorFlow-side only; the vectorised loops are in
// uniform_sparse_cpu_loops.h): the tiling constants and density thresholds
// that pick a gradient path (uniform_sparse_grad_plan.h), and the small
// inline helpers that more than one path uses.  Everything here is inline
// or a template, so each path's hot loops keep their helpers in their own
// translation unit.
//
//   uniform_sparse_cpu_forward.cc        ForwardCpu
//   uniform_sparse_cpu_gradients.cc      GradientsCpu: plan, then its path
//   uniform_sparse_grad_signal_rows.cc   GradientsBySignalRows (sparse)
//   uniform_sparse_grad_label_blocks.cc  GradientsByLabelBlocks (denser)
//   uniform_sparse_grad_feature_rows.cc  GradFeaturesByRows
#ifndef XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_COMMON_H_
#define XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/common/validation.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_loops.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace uniform_sparse_cpu {

constexpr int64_t kTile = 16;  // labels per tile (forward)
// Labels per block of the gradients' signal scan (TileSignal): 512 bytes
// of each backward row per visit, so rows are read in whole cache lines
// that the prefetcher follows.
constexpr int64_t kSignalBlock = 128;
// The features gradient takes the tiled (transposed-forward) path when the
// backward signal has at least this many non-zeros per label column on
// average (estimated), and its per-thread buffers fit in kMaxScatterBytes.
constexpr double kDenseColumnEntries = 1.0;
// A label column with at least bp / kDenseColumnFactor non-zeros takes the
// vectorised dense loops; a sparser one visits only its non-zeros (scalar
// gathers / scatters, several times the cost per entry of the vector loops).
constexpr int64_t kDenseColumnFactor = 32;
// The gradients go instance-major, visiting only the signal's non-zeros
// (GradientsBySignalRows), when the signal has fewer than bp /
// kSparseSignalFactor non-zeros per label column on average (estimated):
// about 10x the cost per non-zero of the dense loops, whose cost does not
// depend on the density, so the instance-major path stays ahead up to
// about 1/10 of the entries non-zero.
constexpr int64_t kSparseSignalFactor = 16;
constexpr int64_t kMaxScatterBytes = int64_t{1} << 30;

// Labels per span of the sparse-signal path (GradientsBySignalRows): the
// span's indices, weights and weights-gradient rows (12 * fan_in bytes a
// label) take about kSpanBytes, so they stay in a core's L2 cache while the
// span's signal entries are applied.
constexpr int64_t kSpanBytes = int64_t{192} << 10;

inline int64_t SpanLabels(int64_t fan_in) {
  const int64_t n = kSpanBytes / (12 * std::max<int64_t>(1, fan_in));
  return std::min<int64_t>(4096, std::max<int64_t>(16, n / 16 * 16));
}

using cpu_loops::CpuIsa;
using cpu_loops::Isa;
using cpu_loops::PaddedBatch;

// ---------------------------------------------------------------------------
// Scalar helpers (the vectorised loops are in uniform_sparse_cpu_loops.h).

// Whether the n signal values p[0:n] are all zero (+0 or -0).  For float
// one OR over the bits without the sign (vectorised): a run of zeros, the
// common case of a squared-hinge signal, costs a fraction of a cycle per
// value instead of a compare and branch each.
template <typename T>
inline bool AllZero(const T* p, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    if (static_cast<float>(p[k]) != 0.0f) return false;
  }
  return true;
}
template <>
inline bool AllZero<float>(const float* p, int64_t n) {
  if (n == kTile) {  // the common case: a constant trip count, unrolled
    uint32_t any = 0;
    for (int64_t k = 0; k < kTile; ++k) {
      uint32_t u;
      std::memcpy(&u, p + k, sizeof(u));
      any |= u << 1;
    }
    return any == 0;
  }
  uint32_t any = 0;
  for (int64_t k = 0; k < n; ++k) {
    uint32_t u;
    std::memcpy(&u, p + k, sizeof(u));
    any |= u << 1;  // drops the sign bit: -0.0f counts as zero
  }
  return any == 0;
}

// Fails the op with InvalidArgument naming indices[p] (p: a flat position).
inline void FailIndex(OpKernelContext* ctx, const int32_t* idx,
                      const UniformSparseDims& d, int64_t p) {
  ctx->CtxFailure(OutOfRange("indices", TensorShape({d.num_labels, d.fan_in}),
                             p, idx[p], 0, d.num_features, "num_features"));
}

// Tiled parallel transpose of features [batch, num_features] into float32
// featT [num_features, bp] (bp >= batch; columns batch..bp-1 zero).
template <typename T>
void TransposeFeatures(OpKernelContext* ctx, const T* features, int64_t batch,
                       int64_t num_features, int64_t bp, float* featT) {
  constexpr int64_t kBlock = 32;
  const int64_t row_blocks = (num_features + kBlock - 1) / kBlock;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, row_blocks, bp * kBlock * 2,
      [&](int64_t start, int64_t limit) {
        for (int64_t rb = start; rb < limit; ++rb) {
          const int64_t f0 = rb * kBlock;
          const int64_t f1 = std::min(num_features, f0 + kBlock);
          for (int64_t i0 = 0; i0 < batch; i0 += kBlock) {
            const int64_t i1 = std::min(batch, i0 + kBlock);
            for (int64_t i = i0; i < i1; ++i) {
              const T* src = features + i * num_features;
              for (int64_t f = f0; f < f1; ++f) {
                featT[f * bp + i] = static_cast<float>(src[f]);
              }
            }
          }
          if (bp > batch) {
            for (int64_t f = f0; f < f1; ++f) {
              std::fill(featT + f * bp + batch, featT + (f + 1) * bp, 0.0f);
            }
          }
        }
      });
}

// The n values at p as float32: p itself for float, else a converted copy
// held in `storage`.
template <typename T>
const float* AsFloat(const T* p, int64_t n, std::vector<float>* storage) {
  storage->resize(n);
  for (int64_t i = 0; i < n; ++i) (*storage)[i] = static_cast<float>(p[i]);
  return storage->data();
}
template <>
inline const float* AsFloat<float>(const float* p, int64_t,
                                   std::vector<float>*) {
  return p;
}

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_COMMON_H_
