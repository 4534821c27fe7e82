// Op kernels of the sampled-scoring op family (and, when built with nvcc,
// their GPU functors and registrations).  See sampled_ops.cc for the op
// contracts.
//
// Sources: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3 (uniform-sparse layer,
// zero-skipping backward); Mehta et al., ASTRA, Algorithm 1 (score only the
// positives and the sampled negatives of each instance).
//
// Structure: one OpKernel class per op, templated on the device (ops/common/
// device.h) and the dtype: it reads the operands (WeightsOperand for the
// Resource* variants), checks ranks and shapes and allocates the output,
// then calls functor::SampledMatmul / SampledMatmulGradFeatures /
// SampledMatmulGradWeights<Device, T> (sampled_kernels.h).  The CPU
// functors are in sampled_cpu.cc (declared in sampled_cpu.h); the GPU ones
// (float32, behind XMC_TF_WITH_CUDA) are below and call the launchers of
// sampled_kernels.cu.cc, which range-check on the device.
//
// The Resource* variants read the weights from a resource variable in
// place (WeightsOperand), so a training step never copies the whole
// [num_labels, fan_in] weights (see WeightsOperand for TensorFlow's
// copy-on-read mode).

#include <cstdint>
#include <optional>

#include "ops/common/gpu.h"
#include "ops/common/validation.h"
#include "ops/sampled/sampled_cpu.h"
#include "ops/sampled/sampled_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"

namespace xmc_tf {

namespace {

// ---------------------------------------------------------------------------
// Validation shared by the CPU and GPU kernels (the index range: the CPU
// functors of sampled_cpu.cc, the GPU launchers on the device).

// Checks ranks and shapes; `weights` and `backward` may be absent (nullptr).
Status ValidateSampledShapes(const Tensor& features, const Tensor& indices,
                             const Tensor* weights, const Tensor& candidates,
                             const Tensor* backward, SampledDims* d) {
  TF_RETURN_IF_ERROR(CheckMatrix(features, "features"));
  TF_RETURN_IF_ERROR(CheckMatrix(indices, "indices"));
  TF_RETURN_IF_ERROR(CheckMatrix(candidates, "candidates"));
  d->batch = features.dim_size(0);
  d->num_features = features.dim_size(1);
  d->num_labels = indices.dim_size(0);
  d->fan_in = indices.dim_size(1);
  d->num_candidates = candidates.dim_size(1);
  TF_RETURN_IF_ERROR(CheckInt32Indexable(d->num_features, "num_features"));
  if (weights != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*weights, "weights"));
    TF_RETURN_IF_ERROR(CheckSameShape(*weights, "weights", indices, "indices",
                                      "[num_labels, fan_in]"));
  }
  if (candidates.dim_size(0) != d->batch) {
    return errors::InvalidArgument(
        "candidates shape ", candidates.shape().DebugString(),
        " must be [batch, num_candidates] with batch = ", d->batch,
        " (rows of features)");
  }
  if (backward != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*backward, "backward"));
    TF_RETURN_IF_ERROR(CheckSameShape(*backward, "backward", candidates,
                                      "candidates", "[batch, num_candidates]"));
  }
  return ::tensorflow::OkStatus();
}

// The weights operand of a kernel: input `index` itself, or (the Resource*
// ops) the buffer of the resource variable that input `index` points to,
// read in place under the variable's shared lock for the kernel's lifetime.
// TensorFlow puts a variable that has seen a sparse op (the optimizer's
// scatter of our IndexedSlices gradient) in copy-on-read mode, where every
// dense read (ReadVariableOp) copies the whole [num_labels, fan_in] buffer;
// reading in place avoids that copy, as ResourceGather does.
class WeightsOperand {
 public:
  Status Init(OpKernelContext* ctx, int index, bool resource,
              ::tensorflow::DataType dtype) {
    if (!resource) {
      tensor_ = &ctx->input(index);
      return ::tensorflow::OkStatus();
    }
    TF_RETURN_IF_ERROR(::tensorflow::LookupResource(
        ctx, ::tensorflow::HandleFromInput(ctx, index), &var_));
    lock_.emplace(*var_->mu());
    tensor_ = var_->tensor();
    if (!tensor_->IsInitialized()) {
      return errors::FailedPrecondition(
          "the weights variable is not initialized");
    }
    if (tensor_->dtype() != dtype) {
      return errors::InvalidArgument(
          "the weights variable has dtype ",
          ::tensorflow::DataTypeString(tensor_->dtype()),
          ", the features have ", ::tensorflow::DataTypeString(dtype));
    }
    return ::tensorflow::OkStatus();
  }
  const Tensor& tensor() const { return *tensor_; }

 private:
  ::tensorflow::core::RefCountPtr<::tensorflow::Var> var_;
  std::optional<::tensorflow::tf_shared_lock> lock_;  // released before var_
  const Tensor* tensor_ = nullptr;
};

}  // namespace

// ---------------------------------------------------------------------------
// GPU functors: framework-free CUDA launchers (sampled_kernels.cu.cc) called
// on TensorFlow's stream.  float32 only.

#if XMC_TF_WITH_CUDA
namespace functor {

// Runs the launcher `launcher(pointers..., batch, num_features, num_labels,
// fan_in, num_candidates, error_scratch, bad_positions, stream)` (the
// argument order of every sampled launcher) and turns its result into the
// op status.  The bad values live on the device: the message names the
// position only.
template <typename Launcher, typename... Pointers>
void RunSampledGpu(OpKernelContext* ctx, const SampledDims& d,
                   Launcher launcher, Pointers... pointers) {
  int64_t bad[2];
  OP_REQUIRES_OK(
      ctx, RunCheckedLauncher(
               ctx, "a sampled uniform-sparse kernel", 2, bad,
               [&](int64_t* scratch, int64_t* bad_positions, void* stream) {
                 return launcher(pointers..., d.batch, d.num_features,
                                 d.num_labels, d.fan_in, d.num_candidates,
                                 scratch, bad_positions, stream);
               }));
  if (bad[0] >= 0) {
    ctx->CtxFailure(OutOfRange("candidates",
                               TensorShape({d.batch, d.num_candidates}),
                               bad[0], std::nullopt, 0, d.num_labels,
                               "num_labels"));
  } else if (bad[1] >= 0) {
    ctx->CtxFailure(errors::InvalidArgument(
        OutOfRangeMessage("indices", TensorShape({d.num_labels, d.fan_in}),
                          bad[1], std::nullopt, 0, d.num_features,
                          "num_features"),
        "; it is a connection of a candidate label"));
  }
}

template <>
struct SampledMatmul<GpuDevice, float> {
  void operator()(OpKernelContext* ctx, const float* features,
                  const int32_t* indices, const float* weights,
                  const int32_t* candidates, const SampledDims& d,
                  float* scores) const {
    RunSampledGpu(ctx, d, XmcSampledForwardGpuF32, features, indices, weights,
                  candidates, scores);
  }
};

template <>
struct SampledMatmulGradFeatures<GpuDevice, float> {
  void operator()(OpKernelContext* ctx, const float* backward,
                  const int32_t* indices, const float* weights,
                  const int32_t* candidates, const SampledDims& d,
                  float* grad) const {
    RunSampledGpu(ctx, d, XmcSampledGradFeaturesGpuF32, backward, indices,
                  weights, candidates, grad);
  }
};

template <>
struct SampledMatmulGradWeights<GpuDevice, float> {
  void operator()(OpKernelContext* ctx, const float* backward,
                  const float* features, const int32_t* indices,
                  const int32_t* candidates, const SampledDims& d,
                  float* grad) const {
    RunSampledGpu(ctx, d, XmcSampledGradWeightsGpuF32, backward, features,
                  indices, candidates, grad);
  }
};

}  // namespace functor
#endif  // XMC_TF_WITH_CUDA

// ---------------------------------------------------------------------------
// The op kernels: one class per op, templated on the device and dtype.

namespace {

// The operands of a sampled kernel, in op input order: [backward,] features,
// indices, [weights,] candidates; read (the weights through WeightsOperand:
// a resource variable's buffer in place when `resource`) and shape-checked.
// Holds the weights variable's lock: construct it in Compute, do not copy.
class SampledInputs {
 public:
  Status Init(OpKernelContext* ctx, bool has_backward, bool has_weights,
              bool resource) {
    int i = 0;
    if (has_backward) backward_ = &ctx->input(i++);
    features_ = &ctx->input(i++);
    indices_ = &ctx->input(i++);
    if (has_weights) {
      TF_RETURN_IF_ERROR(
          weights_.Init(ctx, i++, resource, features_->dtype()));
    }
    candidates_ = &ctx->input(i++);
    return ValidateSampledShapes(*features_, *indices_,
                                 has_weights ? &weights_.tensor() : nullptr,
                                 *candidates_, backward_, &d_);
  }

  template <typename T>
  const T* backward() const { return backward_->flat<T>().data(); }
  template <typename T>
  const T* features() const { return features_->flat<T>().data(); }
  const int32_t* indices() const { return indices_->flat<int32_t>().data(); }
  template <typename T>
  const T* weights() const { return weights_.tensor().flat<T>().data(); }
  const int32_t* candidates() const {
    return candidates_->flat<int32_t>().data();
  }
  const Tensor& features_tensor() const { return *features_; }
  const Tensor& candidates_tensor() const { return *candidates_; }
  const SampledDims& dims() const { return d_; }

 private:
  const Tensor* backward_ = nullptr;
  const Tensor* features_ = nullptr;
  const Tensor* indices_ = nullptr;
  WeightsOperand weights_;
  const Tensor* candidates_ = nullptr;
  SampledDims d_;
};

// kResource: weights (input 2) is a resource variable (Xmc>Resource...).
template <typename Device, typename T, bool kResource>
class SampledMatmulOp : public OpKernel {
 public:
  explicit SampledMatmulOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    SampledInputs in;
    OP_REQUIRES_OK(ctx, in.Init(ctx, /*has_backward=*/false,
                                /*has_weights=*/true, kResource));
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.candidates_tensor().shape(),
                                             &scores));
    functor::SampledMatmul<Device, T>()(
        ctx, in.features<T>(), in.indices(), in.weights<T>(), in.candidates(),
        in.dims(), scores->flat<T>().data());
  }
};

// kResource: weights (input 3) is a resource variable.
template <typename Device, typename T, bool kResource>
class SampledMatmulGradFeaturesOp : public OpKernel {
 public:
  explicit SampledMatmulGradFeaturesOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    SampledInputs in;
    OP_REQUIRES_OK(ctx, in.Init(ctx, /*has_backward=*/true,
                                /*has_weights=*/true, kResource));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.features_tensor().shape(),
                                             &grad));
    functor::SampledMatmulGradFeatures<Device, T>()(
        ctx, in.backward<T>(), in.indices(), in.weights<T>(), in.candidates(),
        in.dims(), grad->flat<T>().data());
  }
};

template <typename Device, typename T>
class SampledMatmulGradWeightsOp : public OpKernel {
 public:
  explicit SampledMatmulGradWeightsOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    SampledInputs in;
    OP_REQUIRES_OK(ctx, in.Init(ctx, /*has_backward=*/true,
                                /*has_weights=*/false, /*resource=*/false));
    const SampledDims& d = in.dims();
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0,
                            TensorShape({d.batch * d.num_candidates, d.fan_in}),
                            &grad));
    functor::SampledMatmulGradWeights<Device, T>()(
        ctx, in.backward<T>(), in.features<T>(), in.indices(), in.candidates(),
        d, grad->flat<T>().data());
  }
};

// The resource handle of the Resource* ops stays in host memory on the GPU
// (WeightsOperand reads the variable's buffer in place).
#define REGISTER(DEVICE_NAME, Dev, T, RESOURCE_HANDLE)                      \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseSampledMatmul")           \
                              .Device(DEVICE_NAME)                         \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulOp<Dev, T, false>);                 \
  REGISTER_KERNEL_BUILDER(Name("Xmc>ResourceUniformSparseSampledMatmul")   \
                              .Device(DEVICE_NAME)                         \
                              RESOURCE_HANDLE                              \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulOp<Dev, T, true>);                  \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseSampledMatmulGradFeatures") \
                              .Device(DEVICE_NAME)                         \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulGradFeaturesOp<Dev, T, false>);     \
  REGISTER_KERNEL_BUILDER(                                                 \
      Name("Xmc>ResourceUniformSparseSampledMatmulGradFeatures")           \
          .Device(DEVICE_NAME)                                             \
          RESOURCE_HANDLE                                                  \
          .TypeConstraint<T>("T"),                                         \
      SampledMatmulGradFeaturesOp<Dev, T, true>);                          \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseSampledMatmulGradWeights") \
                              .Device(DEVICE_NAME)                         \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulGradWeightsOp<Dev, T>);

#define XMC_NO_HOST_MEMORY
#define XMC_WEIGHTS_IN_HOST_MEMORY .HostMemory("weights")
REGISTER(DEVICE_CPU, CpuDevice, float, XMC_NO_HOST_MEMORY);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::half, XMC_NO_HOST_MEMORY);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::bfloat16, XMC_NO_HOST_MEMORY);
#if XMC_TF_WITH_CUDA
REGISTER(DEVICE_GPU, GpuDevice, float, XMC_WEIGHTS_IN_HOST_MEMORY);
#endif
#undef XMC_WEIGHTS_IN_HOST_MEMORY
#undef XMC_NO_HOST_MEMORY
#undef REGISTER

}  // namespace
}  // namespace xmc_tf