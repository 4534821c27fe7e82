// Op kernels of the uniform-sparse product and its gradients: one OpKernel
// class per op, templated on the device, calling the functors declared in
// uniform_sparse_kernels.h (CPU: uniform_sparse_cpu.h; GPU: the launchers
// of uniform_sparse_kernels.cu.cc).  See uniform_sparse_ops.cc for the op
// contracts.
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3, Algorithms 1-3.
//
// CPU design (every functor runs on TensorFlow's intra-op thread pool; the
// vector loops are in uniform_sparse_cpu_loops.h, compiled for AVX-512,
// AVX2 + FMA and baseline x86-64 and picked at run time by CPU features;
// the shared constants and helpers in uniform_sparse_cpu_common.h):
//  * Forward (uniform_sparse_cpu_forward.cc): features transposed to featT
//    [num_features, bp], labels in tiles of kTile accumulated in vector
//    registers.
//  * Gradients (GradientsCpu, uniform_sparse_cpu_gradients.cc: both, as
//    Xmc>UniformSparseMatmulGrad, the registered gradient, or either one,
//    as the two single-gradient ops): a plan picks the path by the
//    estimated density of the backward signal (GradientPlan /
//    PlanGradients, uniform_sparse_grad_plan.h), one translation unit each:
//    - a sparse signal goes instance-major, visiting only its non-zeros
//      (GradientsBySignalRows, uniform_sparse_grad_signal_rows.cc);
//    - a denser one: one pass over the labels in blocks of kSignalBlock
//      (GradientsByLabelBlocks, uniform_sparse_grad_label_blocks.cc);
//    - the features gradient of a signal with less than one non-zero per
//      column on average (or whose buffers would be too large) by instance
//      rows (GradFeaturesByRows, uniform_sparse_grad_feature_rows.cc).
//  * In every path (and on the GPU) a zero backward[i, j] contributes
//    exactly 0, even against an inf / NaN feature or weight (no 0 * inf =
//    NaN): which outputs are non-finite does not depend on the density of
//    backward or on the path.
//  * Every kernel validates ranks and shapes, and its functor the range of
//    the indices it reads, and fails with InvalidArgument naming the
//    offending entry: the forward checks every index first; the gradients
//    check a label's row of indices where they first read it (only labels
//    with a non-zero signal), before any use as an address, and report
//    the smallest bad position read (an index of a label without signal
//    is never read; the forward, which every training step runs first,
//    checks them all).

#include <algorithm>
#include <cstdint>
#include <optional>

#include "ops/common/gpu.h"
#include "ops/common/validation.h"
#include "ops/uniform_sparse/uniform_sparse_cpu.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"

namespace xmc_tf {

namespace {

// ---------------------------------------------------------------------------
// Validation shared by the CPU and GPU kernels (the index range: the CPU
// functors below, the GPU launchers on the device).

// Checks ranks and shapes of the operands that are present (nullptr = absent).
Status ValidateShapes(const Tensor* features, const Tensor& indices,
                      const Tensor* weights, const Tensor* backward,
                      UniformSparseDims* d) {
  TF_RETURN_IF_ERROR(CheckMatrix(indices, "indices"));
  d->num_labels = indices.dim_size(0);
  d->fan_in = indices.dim_size(1);
  if (features != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*features, "features"));
    d->batch = features->dim_size(0);
    d->num_features = features->dim_size(1);
    TF_RETURN_IF_ERROR(CheckInt32Indexable(d->num_features, "num_features"));
  }
  if (weights != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*weights, "weights"));
    TF_RETURN_IF_ERROR(CheckSameShape(*weights, "weights", indices, "indices",
                                      "[num_labels, fan_in]"));
  }
  if (backward != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*backward, "backward"));
    if (backward->dim_size(0) != d->batch ||
        backward->dim_size(1) != d->num_labels) {
      return errors::InvalidArgument(
          "backward shape ", backward->shape().DebugString(), " must be [",
          d->batch, ", ", d->num_labels, "] ([batch, num_labels])");
    }
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// CPU functors (uniform_sparse_cpu.h).

namespace functor {

template <typename T>
struct UniformSparseMatmul<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* scores) const {
    uniform_sparse_cpu::ForwardCpu(ctx, features, indices, weights, d,
                                   scores);
  }
};

template <typename T>
struct UniformSparseMatmulGradFeatures<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features) const {
    uniform_sparse_cpu::GradientsCpu<T>(ctx, backward, nullptr, indices,
                                        weights, d, grad_features, nullptr);
  }
};

template <typename T>
struct UniformSparseMatmulGradWeights<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const UniformSparseDims& d,
                  T* grad_weights) const {
    uniform_sparse_cpu::GradientsCpu<T>(ctx, backward, features, indices,
                                        nullptr, d, nullptr, grad_weights);
  }
};

template <typename T>
struct UniformSparseMatmulGrad<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) const {
    uniform_sparse_cpu::GradientsCpu<T>(ctx, backward, features, indices,
                                        weights, d, grad_features,
                                        grad_weights);
  }
};

// ---------------------------------------------------------------------------
// GPU functors: framework-free CUDA launchers (uniform_sparse_kernels.cu.cc)
// called on TensorFlow's stream with a workspace from TensorFlow's allocator;
// they range-check indices on the device.  float, half and bfloat16 (float
// accumulation).

#if XMC_TF_WITH_CUDA

namespace {

// The launchers of one value type (F32 / F16 / BF16); Bits is the pointer
// type they take (float, or the uint16_t bits of Eigen::half / bfloat16).
template <typename T>
struct GpuLaunchers;

#define XMC_US_GPU_LAUNCHERS(T, BITS, SUFFIX)                     \
  template <>                                                     \
  struct GpuLaunchers<T> {                                        \
    using Bits = BITS;                                            \
    static constexpr auto forward = XmcUniformSparseForwardGpu##SUFFIX;  \
    static constexpr auto grad_features =                         \
        XmcUniformSparseGradFeaturesGpu##SUFFIX;                  \
    static constexpr auto grad_weights =                          \
        XmcUniformSparseGradWeightsGpu##SUFFIX;                   \
    static constexpr auto grad = XmcUniformSparseGradGpu##SUFFIX; \
  };
XMC_US_GPU_LAUNCHERS(float, float, F32)
XMC_US_GPU_LAUNCHERS(Eigen::half, uint16_t, F16)
XMC_US_GPU_LAUNCHERS(Eigen::bfloat16, uint16_t, BF16)
#undef XMC_US_GPU_LAUNCHERS

// A T pointer as the launchers' pointer type (same bits).
template <typename T>
auto Bits(const T* p) {
  return reinterpret_cast<const typename GpuLaunchers<T>::Bits*>(p);
}
template <typename T>
auto Bits(T* p) {
  return reinterpret_cast<typename GpuLaunchers<T>::Bits*>(p);
}

// Calls launcher(operands..., batch, num_features, num_labels, fan_in,
// workspace, error_scratch, bad_position, stream) (the launchers' common
// signature) with a workspace of the size the launcher asks for (`kind`:
// 0 forward, 1 grad features, 2 grad weights, 3 both), and fails the op on
// an allocation failure, a CUDA error or an out-of-range index.
template <typename T, typename Launcher, typename... Operands>
void RunUniformSparseGpu(OpKernelContext* ctx, const UniformSparseDims& d,
                         int kind, Launcher launcher, Operands... operands) {
  const int64_t bytes = XmcUniformSparseGpuWorkspaceBytes(
      kind, sizeof(T), d.batch, d.num_features, d.num_labels, d.fan_in);
  OP_REQUIRES(ctx, bytes >= 0,
              errors::Internal("xmc_tf: bad uniform-sparse workspace query"));
  Tensor workspace;
  OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT8,
                                         TensorShape({std::max<int64_t>(
                                             bytes, 1)}),
                                         &workspace));
  void* workspace_ptr = workspace.flat<int8_t>().data();
  const auto launch = [&](int64_t* scratch, int64_t* bad_position,
                          void* stream) {
    return launcher(operands..., d.batch, d.num_features, d.num_labels,
                    d.fan_in, workspace_ptr, scratch, bad_position, stream);
  };
  int64_t bad = -1;
  OP_REQUIRES_OK(ctx, RunCheckedLauncher(ctx, "a uniform-sparse kernel", 1,
                                         &bad, launch));
  if (bad >= 0) {  // the index values live on the device: name the position
    ctx->CtxFailure(OutOfRange("indices",
                               TensorShape({d.num_labels, d.fan_in}), bad,
                               std::nullopt, 0, d.num_features,
                               "num_features"));
  }
}

}  // namespace

template <typename T>
struct UniformSparseMatmul<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* scores) const {
    RunUniformSparseGpu<T>(ctx, d, 0, GpuLaunchers<T>::forward,
                           Bits(features), indices, Bits(weights),
                           Bits(scores));
  }
};

template <typename T>
struct UniformSparseMatmulGradFeatures<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features) const {
    RunUniformSparseGpu<T>(ctx, d, 1, GpuLaunchers<T>::grad_features,
                           Bits(backward), indices, Bits(weights),
                           Bits(grad_features));
  }
};

template <typename T>
struct UniformSparseMatmulGradWeights<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const UniformSparseDims& d,
                  T* grad_weights) const {
    RunUniformSparseGpu<T>(ctx, d, 2, GpuLaunchers<T>::grad_weights,
                           Bits(backward), Bits(features), indices,
                           Bits(grad_weights));
  }
};

template <typename T>
struct UniformSparseMatmulGrad<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) const {
    RunUniformSparseGpu<T>(ctx, d, 3, GpuLaunchers<T>::grad, Bits(backward),
                           Bits(features), indices, Bits(weights),
                           Bits(grad_features), Bits(grad_weights));
  }
};

#endif  // XMC_TF_WITH_CUDA

}  // namespace functor

// ---------------------------------------------------------------------------
// The op kernels: one class per op, templated on the device and dtype; each
// validates ranks and shapes, allocates its outputs and calls its functor.

namespace {

template <typename T>
const T* Data(const Tensor& t) {
  return t.flat<T>().data();
}
template <typename T>
T* Data(Tensor* t) {
  return t->flat<T>().data();
}

// The operands of the gradient ops: backward, features, indices (inputs 0-2)
// and, `with_weights`, weights (input 3).
struct GradientOperands {
  GradientOperands(OpKernelContext* ctx, bool with_weights)
      : backward(ctx->input(0)),
        features(ctx->input(1)),
        indices(ctx->input(2)),
        weights(with_weights ? &ctx->input(3) : nullptr) {}
  Status Validate(UniformSparseDims* d) const {
    return ValidateShapes(&features, indices, weights, &backward, d);
  }
  const Tensor& backward;
  const Tensor& features;
  const Tensor& indices;
  const Tensor* weights;  // nullptr without weights
};

template <typename Device, typename T>
class UniformSparseMatmulOp : public OpKernel {
 public:
  explicit UniformSparseMatmulOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& features = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx,
                   ValidateShapes(&features, indices, &weights, nullptr, &d));
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({d.batch, d.num_labels}), &scores));
    functor::UniformSparseMatmul<Device, T>()(
        ctx, Data<T>(features), Data<int32_t>(indices), Data<T>(weights), d,
        Data<T>(scores));
  }
};

template <typename Device, typename T>
class UniformSparseMatmulGradFeaturesOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradFeaturesOp(OpKernelConstruction* c)
      : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const GradientOperands in(ctx, /*with_weights=*/true);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx, in.Validate(&d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.features.shape(), &grad));
    functor::UniformSparseMatmulGradFeatures<Device, T>()(
        ctx, Data<T>(in.backward), Data<int32_t>(in.indices),
        Data<T>(*in.weights), d, Data<T>(grad));
  }
};

template <typename Device, typename T>
class UniformSparseMatmulGradWeightsOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradWeightsOp(OpKernelConstruction* c)
      : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const GradientOperands in(ctx, /*with_weights=*/false);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx, in.Validate(&d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.indices.shape(), &grad));
    functor::UniformSparseMatmulGradWeights<Device, T>()(
        ctx, Data<T>(in.backward), Data<T>(in.features),
        Data<int32_t>(in.indices), d, Data<T>(grad));
  }
};

template <typename Device, typename T>
class UniformSparseMatmulGradOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const GradientOperands in(ctx, /*with_weights=*/true);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx, in.Validate(&d));
    Tensor* grad_features = nullptr;
    Tensor* grad_weights = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, in.features.shape(), &grad_features));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, in.indices.shape(), &grad_weights));
    functor::UniformSparseMatmulGrad<Device, T>()(
        ctx, Data<T>(in.backward), Data<T>(in.features),
        Data<int32_t>(in.indices), Data<T>(*in.weights), d,
        Data<T>(grad_features), Data<T>(grad_weights));
  }
};

#define REGISTER(DEVICE_NAME, Dev, T)                                        \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("Xmc>UniformSparseMatmul").Device(DEVICE_NAME).TypeConstraint<T>( \
          "T"),                                                              \
      UniformSparseMatmulOp<Dev, T>);                                        \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradFeatures")        \
                              .Device(DEVICE_NAME)                           \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradFeaturesOp<Dev, T>);        \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradWeights")         \
                              .Device(DEVICE_NAME)                           \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradWeightsOp<Dev, T>);         \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGrad")                \
                              .Device(DEVICE_NAME)                           \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradOp<Dev, T>);

REGISTER(DEVICE_CPU, CpuDevice, float);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::half);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::bfloat16);
#if XMC_TF_WITH_CUDA
REGISTER(DEVICE_GPU, GpuDevice, float);
REGISTER(DEVICE_GPU, GpuDevice, Eigen::half);
REGISTER(DEVICE_GPU, GpuDevice, Eigen::bfloat16);
#endif
#undef REGISTER

}  // namespace
}  // namespace xmc_tf
