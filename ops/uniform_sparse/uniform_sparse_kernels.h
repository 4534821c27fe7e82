// Shared functor header of the uniform-sparse op family.
//
// Layout (chosen here, see the op docstrings in uniform_sparse_ops.cc):
//   features  [batch, num_features]          T, row-major
//   indices   [num_labels, fan_in]           int32, row-major ("label-major")
//   weights   [num_labels, fan_in]           T, row-major
//   scores    [batch, num_labels]            T
// Row j of `indices`/`weights` holds the `fan_in` incoming connections of
// label j (Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2, Fig. 1c; the paper stores the
// transpose [s, m]).
//
// This header is included both by the TensorFlow kernels (g++) and by the
// framework-free CUDA launchers (nvcc): it must not include TensorFlow.
//
// Structure (ops/common/device.h): one OpKernel class per op, templated on
// the device, validates ranks and shapes, allocates the outputs and calls
// the functor below; the CpuDevice functors (every registered T: float,
// half, bfloat16, accumulated in float32) are in uniform_sparse_kernels.cc
// (calling uniform_sparse_cpu.h: one translation unit per CPU path), the
// GpuDevice ones (float, half and bfloat16, behind XMC_TF_WITH_CUDA)
// call the extern "C" launchers declared further down.  Each functor
// range-checks `indices` itself and fails the op with InvalidArgument on an
// entry outside [0, num_features): the forward and the GPU launchers every
// entry, the CPU gradients the rows of the labels with a non-zero signal
// (the only rows they read).
#ifndef XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_KERNELS_H_
#define XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_KERNELS_H_

#include <cstdint>

#include "ops/common/device.h"

namespace xmc_tf {

struct UniformSparseDims {
  int64_t batch = 0, num_features = 0, num_labels = 0, fan_in = 0;
};

namespace functor {

// scores [batch, num_labels] (Algorithm 1).
template <typename Device, typename T>
struct UniformSparseMatmul {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* scores) const;
};

// grad_features [batch, num_features] (Algorithm 2).
template <typename Device, typename T>
struct UniformSparseMatmulGradFeatures {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features) const;
};

// grad_weights [num_labels, fan_in] (Algorithm 3).
template <typename Device, typename T>
struct UniformSparseMatmulGradWeights {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const T* features, const int32_t* indices,
                  const UniformSparseDims& d, T* grad_weights) const;
};

// Both gradients from one pass over `backward` (Algorithms 2 and 3).
template <typename Device, typename T>
struct UniformSparseMatmulGrad {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const T* features, const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) const;
};

}  // namespace functor
}  // namespace xmc_tf

#ifdef __cplusplus
extern "C" {
#endif

// Framework-free CUDA launchers (implemented in uniform_sparse_kernels.cu.cc).
//
// All pointers are device pointers except `bad_position` (host).  `stream` is
// a `cudaStream_t` passed as `void*` so that callers need no CUDA headers.
// Value types: F32 = float; F16 / BF16 = IEEE half / bfloat16, passed as
// their uint16_t bit patterns (Eigen::half / Eigen::bfloat16 have the same
// layout); products are accumulated in float32 for every type.
// `error_scratch` is a device buffer of at least one int64 that the launcher
// may overwrite.  `workspace` is a device buffer of at least
// XmcUniformSparseGpuWorkspaceBytes(kind, sizeof(value), batch,
// num_features, num_labels, fan_in) bytes, 256-byte aligned, that the
// launcher may overwrite (it holds the features transposed to [e, ld], the
// features gradient in that layout, and for 16-bit types a float
// accumulator of the weights gradient; ld = batch rounded up to a multiple
// of 32).
//
// Each launcher enqueues its work on `stream`, then copies the index check
// result back and synchronises the stream (the one host synchronisation per
// call), and returns a `cudaError_t` as int (0 = cudaSuccess).  On return,
// `*bad_position` is -1 when every index was in range, else the smallest
// flat position (j * fan_in + k) of an out-of-range entry of `indices`;
// outputs are then unspecified and must not be used.

// Workspace bytes of a launch: kind 0 = forward, 1 = gradient w.r.t.
// features, 2 = gradient w.r.t. weights, 3 = both gradients; value_bytes is
// 4 (F32) or 2 (F16, BF16).  -1 for a bad argument.
int64_t XmcUniformSparseGpuWorkspaceBytes(int kind, int value_bytes,
                                          int64_t batch, int64_t num_features,
                                          int64_t num_labels, int64_t fan_in);

// Declares, for one value type CT and suffix:
//
// Forward (Algorithm 1): scores[i, j] = sum_k features[i, indices[j, k]] *
// weights[j, k].
//
// Gradient w.r.t. features (Algorithm 2): grad_features[i, indices[j, k]] +=
// backward[i, j] * weights[j, k]; a zero backward[i, j] contributes nothing
// (no weight or feature is read for it).  `grad_features` [batch,
// num_features] is fully written.
//
// Gradient w.r.t. weights (Algorithm 3): grad_weights[j, k] = sum_i
// backward[i, j] * features[i, indices[j, k]], skipping the features load
// where backward[i, j] == 0.  `grad_weights` [num_labels, fan_in] is fully
// written.
//
// Both gradients (Algorithms 2 and 3 in one pass over backward).
#define XMC_US_DECLARE_LAUNCHERS(SUFFIX, CT)                                   \
  int XmcUniformSparseForwardGpu##SUFFIX(                                      \
      const CT* features, const int32_t* indices, const CT* weights,           \
      CT* scores, int64_t batch, int64_t num_features, int64_t num_labels,     \
      int64_t fan_in, void* workspace, int64_t* error_scratch,                 \
      int64_t* bad_position, void* stream);                                    \
  int XmcUniformSparseGradFeaturesGpu##SUFFIX(                                 \
      const CT* backward, const int32_t* indices, const CT* weights,           \
      CT* grad_features, int64_t batch, int64_t num_features,                  \
      int64_t num_labels, int64_t fan_in, void* workspace,                     \
      int64_t* error_scratch, int64_t* bad_position, void* stream);            \
  int XmcUniformSparseGradWeightsGpu##SUFFIX(                                  \
      const CT* backward, const CT* features, const int32_t* indices,          \
      CT* grad_weights, int64_t batch, int64_t num_features,                   \
      int64_t num_labels, int64_t fan_in, void* workspace,                     \
      int64_t* error_scratch, int64_t* bad_position, void* stream);            \
  int XmcUniformSparseGradGpu##SUFFIX(                                         \
      const CT* backward, const CT* features, const int32_t* indices,          \
      const CT* weights, CT* grad_features, CT* grad_weights, int64_t batch,   \
      int64_t num_features, int64_t num_labels, int64_t fan_in,                \
      void* workspace, int64_t* error_scratch, int64_t* bad_position,          \
      void* stream);

XMC_US_DECLARE_LAUNCHERS(F32, float)
XMC_US_DECLARE_LAUNCHERS(F16, uint16_t)
XMC_US_DECLARE_LAUNCHERS(BF16, uint16_t)
#undef XMC_US_DECLARE_LAUNCHERS

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_KERNELS_H_
