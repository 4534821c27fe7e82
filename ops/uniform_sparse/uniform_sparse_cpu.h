// The CPU implementation of the uniform-sparse product and its gradients,
// as the CpuDevice functors of uniform_sparse_kernels.cc call it
// (TensorFlow-side only).  Every function runs on TensorFlow's intra-op
// thread pool, range-checks the indices it reads and fails the op with
// InvalidArgument naming the offending entry (see uniform_sparse_kernels.cc
// for the design overview).
//
//   ForwardCpu    uniform_sparse_cpu_forward.cc
//   GradientsCpu  uniform_sparse_cpu_gradients.cc (plans the path, then
//                 runs it: uniform_sparse_grad_plan.h)
//
// Both are templates defined in those files and explicitly instantiated
// there for every T of XMC_US_CPU_TYPES.
#ifndef XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_H_
#define XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_H_

#include <cstdint>

#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

// Calls M(T) for every value type the CPU kernels are registered for
// (REGISTER(DEVICE_CPU, ...) in uniform_sparse_kernels.cc): the explicit
// instantiations of the CPU translation units.
#define XMC_US_CPU_TYPES(M) M(float) M(Eigen::half) M(Eigen::bfloat16)

namespace xmc_tf {
namespace uniform_sparse_cpu {

// scores `out` [batch, num_labels] (Algorithm 1); checks every index first.
template <typename T>
void ForwardCpu(::tensorflow::OpKernelContext* ctx, const T* features,
                const int32_t* idx, const T* weights,
                const UniformSparseDims& d, T* out);

// Both gradients or either one (a null output is not computed;
// Algorithms 2 and 3): `feat` may be null without grad_weights, `weights`
// without grad_features.
template <typename T>
void GradientsCpu(::tensorflow::OpKernelContext* ctx, const T* back,
                  const T* feat, const int32_t* idx, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights);

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CPU_H_
