// Shared functor header of the row-sparse optimizer op family.
//
// One Adam step on one row of a variable, for the rows that a row-sparse
// (tf.IndexedSlices) gradient touches.  Kingma & Ba, "Adam: A Method for
// Stochastic Optimization", ICLR 2015, Algorithm 1, with the bias corrections
// folded into the step size as in the paper's Sec. 2 ("the efficiency of
// algorithm 1 can be improved"): alpha_t = lr * sqrt(1 - beta2^t) /
// (1 - beta1^t), computed by the caller.  Same formula, operation for
// operation, as keras.optimizers.Adam and xmc_tf.optimizers.LazyAdam:
//
//   m   += (g - m) * (1 - beta1)
//   v   += (g * g - v) * (1 - beta2)
//   var -= (m * alpha) / (sqrt(v) + epsilon)
//
// Framework-free (no TensorFlow includes), so that a CUDA launcher can share
// it.  The op kernels (one class per op, templated on the device:
// ops/common/device.h) look up, lock and check the variables, then call
// functor::SparseApplyAdam / ApplyAdam<Device, ...> below (CpuDevice in
// optimizer_kernels.cc; no GPU kernels yet).
#ifndef XMC_TF_OPS_OPTIMIZERS_OPTIMIZER_KERNELS_H_
#define XMC_TF_OPS_OPTIMIZERS_OPTIMIZER_KERNELS_H_

#include <cmath>
#include <cstdint>

#include "ops/common/device.h"

namespace xmc_tf {

// Constants of one Adam step, in the variable's dtype T.
template <typename T>
struct AdamStep {
  T alpha;           // bias-corrected step size alpha_t
  T one_minus_beta1;
  T one_minus_beta2;
  T epsilon;
};

// Updates `n` contiguous elements of one row: var, m, v in place, g read.
// No aliasing between the four arrays (checked by the kernel).
template <typename T>
inline void AdamRowUpdate(const AdamStep<T>& step, const T* __restrict__ g,
                          T* __restrict__ var, T* __restrict__ m,
                          T* __restrict__ v, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T gj = g[j];
    const T mj = m[j] + (gj - m[j]) * step.one_minus_beta1;
    const T vj = v[j] + (gj * gj - v[j]) * step.one_minus_beta2;
    m[j] = mj;
    v[j] = vj;
    var[j] -= (mj * step.alpha) / (std::sqrt(vj) + step.epsilon);
  }
}

namespace functor {

// The k rows ids[0:k] (distinct, in range: checked by the kernel) of var, m
// and v [rows, d], in place; g is [k, d].
template <typename Device, typename T, typename Index>
struct SparseApplyAdam {
  void operator()(::tensorflow::OpKernelContext* ctx, const AdamStep<T>& step,
                  const T* g, const Index* ids, int64_t k, int64_t d, T* var,
                  T* m, T* v) const;
};

// Every one of the n elements of var, m and v, in place; g has n elements.
template <typename Device, typename T>
struct ApplyAdam {
  void operator()(::tensorflow::OpKernelContext* ctx, const AdamStep<T>& step,
                  const T* g, int64_t n, T* var, T* m, T* v) const;
};

}  // namespace functor
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_OPTIMIZERS_OPTIMIZER_KERNELS_H_
