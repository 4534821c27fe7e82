// The CPU gradients of the uniform-sparse product (GradientsCpu of
// uniform_sparse_cpu.h): the plan (PlanGradients, uniform_sparse_grad_plan.h
// for the paths and when each is taken) and the dispatcher that makes it
// from the estimated density of the backward signal and runs its path.
//
// In every path a zero backward[i, j] contributes exactly 0 and nothing of
// label j is read for it (Sec. 3.3); the gradients check a label's row of
// indices where they first read it (only labels with a non-zero signal),
// before any use as an address, and report the smallest bad position read.

#include <algorithm>
#include <cstdint>

#include "ops/uniform_sparse/uniform_sparse_cpu.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_common.h"
#include "ops/uniform_sparse/uniform_sparse_grad_plan.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace xmc_tf {
namespace uniform_sparse_cpu {

namespace {

// Estimated fraction of non-zeros in backward from a fixed pseudo-random
// sample (a performance heuristic only; results never depend on it).
template <typename T>
double EstimateDensity(const T* back, int64_t n) {
  if (n == 0) return 0.0;
  constexpr int64_t kSamples = 4096;
  if (n <= kSamples) {
    int64_t nz = 0;
    for (int64_t p = 0; p < n; ++p) nz += static_cast<float>(back[p]) != 0.0f;
    return static_cast<double>(nz) / n;
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  int64_t nz = 0;
  for (int64_t s = 0; s < kSamples; ++s) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    nz += static_cast<float>(back[(state >> 17) % static_cast<uint64_t>(n)]) !=
          0.0f;
  }
  return static_cast<double>(nz) / kSamples;
}

// Whether a signal of this estimated density is best loaded as dense
// columns (TileSignal): when a typical column takes the dense loops.
inline bool DenseSignal(double density, int64_t batch, int64_t bp) {
  return density * batch * kDenseColumnFactor >= bp;
}

// Whether a signal of this estimated density takes the instance-major
// path (GradientsBySignalRows).
inline bool SparseSignal(double density, int64_t batch, int64_t bp) {
  return density * batch * kSparseSignalFactor < bp;
}

// The no-pass plan's check (GradientPath::kNoPass): nothing to compute (no
// features, or fan_in 0), but a label with signal is still read: with no
// features each of its indices is out of range.
template <typename T>
void CheckSignalWithoutPass(OpKernelContext* ctx, const T* back,
                            const int32_t* idx, const UniformSparseDims& d) {
  if (d.num_features == 0 && d.fan_in > 0) {
    int64_t first = d.num_labels;  // the smallest label with signal
    for (int64_t i = 0; i < d.batch; ++i) {
      const T* row = back + i * d.num_labels;
      for (int64_t j = 0; j < first; ++j) {
        if (static_cast<float>(row[j]) != 0.0f) first = j;
      }
    }
    if (first < d.num_labels) return FailIndex(ctx, idx, d, first * d.fan_in);
  }
}

}  // namespace

GradientPlan PlanGradients(const UniformSparseDims& d, double density,
                           int64_t threads, bool features_grad,
                           bool weights_grad) {
  GradientPlan plan;
  plan.density = density;
  plan.bp = PaddedBatch(d.batch);
  plan.dense_signal = DenseSignal(density, d.batch, plan.bp);
  const int64_t num_blocks = (d.num_labels + kSignalBlock - 1) / kSignalBlock;
  if (SparseSignal(density, d.batch, plan.bp) && d.num_labels > 0) {
    // A sparse signal: instance-major, when the per-unit features-gradient
    // buffers fit.
    const int64_t spans =
        (d.num_labels + SpanLabels(d.fan_in) - 1) / SpanLabels(d.fan_in);
    const int64_t p = std::max<int64_t>(1, std::min(threads, spans));
    if (!features_grad ||
        static_cast<double>(p) * d.batch * d.num_features * 4 <=
            static_cast<double>(kMaxScatterBytes)) {
      plan.path = GradientPath::kSignalRows;
      plan.parts = p;
      return plan;
    }
  }
  // The features gradient: in the pass (scattered into per-part buffers),
  // by rows, or nothing to do.
  if (features_grad && d.batch * d.num_features > 0) {
    const int64_t p = std::max<int64_t>(1, std::min(threads, num_blocks));
    if (density * d.batch >= kDenseColumnEntries && d.num_labels > 0 &&
        static_cast<double>(p) * d.num_features * plan.bp * 4 <=
            static_cast<double>(kMaxScatterBytes)) {
      plan.parts = p;
    } else {
      plan.features_by_rows = true;
    }
  }
  plan.weights_grad = weights_grad && d.fan_in > 0;
  // No pass when it has nothing to compute, or no labels to visit.
  plan.path = (plan.parts == 0 && !plan.weights_grad) || num_blocks == 0
                  ? GradientPath::kNoPass
                  : GradientPath::kLabelBlocks;
  return plan;
}

// Both gradients or either one (a null output is not computed): the plan
// for the estimated density of the signal, then its path.
template <typename T>
void GradientsCpu(OpKernelContext* ctx, const T* back, const T* feat,
                  const int32_t* idx, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t threads = std::max(1, workers->num_threads);
  const GradientPlan plan =
      PlanGradients(d, EstimateDensity(back, d.batch * d.num_labels), threads,
                    grad_features != nullptr, grad_weights != nullptr);
  if (plan.path == GradientPath::kSignalRows) {
    GradientsBySignalRows(ctx, back, feat, idx, weights, d, plan,
                          grad_features, grad_weights);
    return;
  }
  if (plan.features_by_rows) {
    GradFeaturesByRows(ctx, back, idx, weights, d, grad_features);
    if (!ctx->status().ok()) return;
  }
  if (plan.path == GradientPath::kNoPass) {
    return CheckSignalWithoutPass(ctx, back, idx, d);
  }
  GradientsByLabelBlocks(ctx, back, feat, idx, weights, d, plan,
                         grad_features, grad_weights);
}

#define XMC_US_INSTANTIATE(T)                                            \
  template void GradientsCpu<T>(OpKernelContext*, const T*, const T*,   \
                                const int32_t*, const T*,               \
                                const UniformSparseDims&, T*, T*);
XMC_US_CPU_TYPES(XMC_US_INSTANTIATE)
#undef XMC_US_INSTANTIATE

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf
