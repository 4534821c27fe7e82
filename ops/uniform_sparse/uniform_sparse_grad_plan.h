// The plan of the CPU gradients (GradientsCpu of uniform_sparse_cpu.h:
// both, as Xmc>UniformSparseMatmulGrad, the registered gradient, or either
// one, as the two single-gradient ops): which path computes them, chosen by
// the estimated density of the backward signal (a performance choice only;
// every path gives the same results and errors), and the paths it runs,
// one translation unit each:
//  * a sparse signal (fewer than bp / kSparseSignalFactor non-zeros per
//    label column on average) goes instance-major, when the per-part
//    features-gradient buffers fit in kMaxScatterBytes
//    (GradientsBySignalRows, uniform_sparse_grad_signal_rows.cc);
//  * a denser one: one pass over the labels in blocks of kSignalBlock
//    (GradientsByLabelBlocks, uniform_sparse_grad_label_blocks.cc), the
//    features gradient scattered into per-part gT buffers in the pass;
//    when the signal has less than one non-zero per column on average (or
//    the buffers would exceed kMaxScatterBytes), the features gradient is
//    computed by instance rows first (GradFeaturesByRows,
//    uniform_sparse_grad_feature_rows.cc) and the pass computes the
//    weights gradient only (or there is no pass).
// PlanGradients (uniform_sparse_cpu_gradients.cc) makes the choice;
// GradientsCpu makes the plan and runs its path.
#ifndef XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_GRAD_PLAN_H_
#define XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_GRAD_PLAN_H_

#include <cstdint>

#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace xmc_tf {
namespace uniform_sparse_cpu {

enum class GradientPath {
  // Both gradients (or either) instance-major: GradientsBySignalRows.
  kSignalRows,
  // The label-block pass: GradientsByLabelBlocks (after GradFeaturesByRows
  // when features_by_rows).
  kLabelBlocks,
  // No pass over the labels (nothing to compute after GradFeaturesByRows,
  // if any: no features, fan_in 0 or no labels); a label with signal is
  // still read, and with no features its first index is out of range.
  kNoPass,
};

struct GradientPlan {
  GradientPath path = GradientPath::kNoPass;
  double density = 0.0;  // the estimated fraction of non-zeros in backward
  int64_t bp = 0;        // the batch padded to whole vectors (PaddedBatch)
  // kSignalRows: the parts of the apply pass (one features-gradient buffer
  // each); kLabelBlocks: the parts of the pass, each with its own gT buffer,
  // when the features gradient is computed in the pass, else 0.
  int64_t parts = 0;
  // The features gradient by instance rows (GradFeaturesByRows) before the
  // label-block pass (kLabelBlocks, kNoPass).
  bool features_by_rows = false;
  // kLabelBlocks: the pass computes grad_weights (asked for, fan_in > 0).
  bool weights_grad = false;
  // kLabelBlocks: TileSignal loads the signal as dense columns (a typical
  // column takes the dense loops) rather than as lists of non-zeros.
  bool dense_signal = false;
};

// The plan for gradients of shape d from a signal of estimated `density`
// on `threads` threads; features_grad / weights_grad: which gradients are
// asked for.
GradientPlan PlanGradients(const UniformSparseDims& d, double density,
                           int64_t threads, bool features_grad,
                           bool weights_grad);

// The paths (a null output is not computed).  Templates defined in their
// translation units, explicitly instantiated for XMC_US_CPU_TYPES.
template <typename T>
void GradientsBySignalRows(::tensorflow::OpKernelContext* ctx, const T* back,
                           const T* feat, const int32_t* idx,
                           const T* weights, const UniformSparseDims& d,
                           const GradientPlan& plan, T* grad_features,
                           T* grad_weights);

template <typename T>
void GradientsByLabelBlocks(::tensorflow::OpKernelContext* ctx, const T* back,
                            const T* feat, const int32_t* idx,
                            const T* weights, const UniformSparseDims& d,
                            const GradientPlan& plan, T* grad_features,
                            T* grad_weights);

template <typename T>
void GradFeaturesByRows(::tensorflow::OpKernelContext* ctx, const T* back,
                        const int32_t* idx, const T* w,
                        const UniformSparseDims& d, T* out);

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_GRAD_PLAN_H_
