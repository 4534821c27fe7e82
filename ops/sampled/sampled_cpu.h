// The CPU functors of the sampled-scoring op family: the CpuDevice
// specialisations of functor::SampledMatmul, SampledMatmulGradFeatures and
// SampledMatmulGradWeights (sampled_kernels.h), as the op kernels of
// sampled_kernels.cc call them (TensorFlow-side only).  Their members are
// defined in sampled_cpu.cc and explicitly instantiated there for every T
// of XMC_SAMPLED_CPU_TYPES.
#ifndef XMC_TF_OPS_SAMPLED_SAMPLED_CPU_H_
#define XMC_TF_OPS_SAMPLED_SAMPLED_CPU_H_

#include <cstdint>

#include "ops/common/device.h"
#include "ops/sampled/sampled_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

// Calls M(T) for every value type the CPU kernels are registered for
// (REGISTER(DEVICE_CPU, ...) in sampled_kernels.cc): the explicit
// instantiations of sampled_cpu.cc.
#define XMC_SAMPLED_CPU_TYPES(M) M(float) M(Eigen::half) M(Eigen::bfloat16)

namespace xmc_tf {
namespace functor {

template <typename T>
struct SampledMatmul<CpuDevice, T> {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const int32_t* candidates, const SampledDims& d,
                  T* scores) const;
};

template <typename T>
struct SampledMatmulGradFeatures<CpuDevice, T> {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const int32_t* candidates, const SampledDims& d,
                  T* grad_features) const;
};

template <typename T>
struct SampledMatmulGradWeights<CpuDevice, T> {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const T* features, const int32_t* indices,
                  const int32_t* candidates, const SampledDims& d,
                  T* grad_values) const;
};

}  // namespace functor
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_SAMPLED_SAMPLED_CPU_H_
