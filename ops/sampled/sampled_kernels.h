// Shared header of the sampled-scoring op family (candidate scoring of the
// uniform-sparse output layer).
//
// Layout:
//   features    [batch, num_features]            T, row-major
//   indices     [num_labels, fan_in]             int32 (label-major, as in
//                                                ops/uniform_sparse/)
//   weights     [num_labels, fan_in]             T
//   candidates  [batch, num_candidates]          int32, entries in
//                                                [0, num_labels)
//   scores      [batch, num_candidates]          T
//   grad_weights values [batch * num_candidates, fan_in]  T: row i*c+j is
//                the gradient of label candidates[i, j]'s row of weights
//                contributed by (i, j) (the values of an IndexedSlices whose
//                indices are the flattened candidates).
//
// scores[i, j] = sum_k features[i, indices[r, k]] * weights[r, k],
// r = candidates[i, j]: the uniform-sparse scores (Schultheis & Babbar,
// "Towards Memory-Efficient Training for Extremely Large Output Spaces",
// Sec. 3.2, Algorithm 1) restricted to a per-instance candidate set, as in
// sampled training with positives plus k negatives (Mehta et al., ASTRA,
// Algorithm 1 steps 17-18 and Sec. 5.2 (c): the matrix product is done with
// the positives and the selected negatives only).
//
// This header is included both by the TensorFlow kernels (g++) and by the
// framework-free CUDA launchers (nvcc): it must not include TensorFlow.
#ifndef XMC_TF_OPS_SAMPLED_SAMPLED_KERNELS_H_
#define XMC_TF_OPS_SAMPLED_SAMPLED_KERNELS_H_

#include <cstdint>

#include "ops/common/device.h"

// ---------------------------------------------------------------------------
// The functors of the op kernels (ops/common/device.h).  One OpKernel class
// per op, templated on the device and T (float, half, bfloat16 on the CPU;
// float on the GPU), reads the operands, checks ranks and shapes and
// allocates the output, then calls functor::X<Device, T> with the sizes
// below.  CpuDevice: sampled_cpu.cc (declared in sampled_cpu.h; TensorFlow's
// intra-op pool); GpuDevice (float): sampled_kernels.cc behind
// XMC_TF_WITH_CUDA, calling the launchers below on TensorFlow's stream.  The
// functors range-check every candidate and every index row they read, and
// fail `ctx` with InvalidArgument naming the first bad entry.

namespace xmc_tf {

struct SampledDims {
  int64_t batch = 0, num_features = 0, num_labels = 0, fan_in = 0,
          num_candidates = 0;
};

namespace functor {

// scores [batch, num_candidates].
template <typename Device, typename T>
struct SampledMatmul {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const int32_t* candidates, const SampledDims& d,
                  T* scores) const;
};

// grad_features [batch, num_features] (fully written).
template <typename Device, typename T>
struct SampledMatmulGradFeatures {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const int32_t* candidates, const SampledDims& d,
                  T* grad_features) const;
};

// grad_weights values [batch * num_candidates, fan_in] (fully written).
template <typename Device, typename T>
struct SampledMatmulGradWeights {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* backward,
                  const T* features, const int32_t* indices,
                  const int32_t* candidates, const SampledDims& d,
                  T* grad_values) const;
};

}  // namespace functor
}  // namespace xmc_tf

#ifdef __cplusplus
extern "C" {
#endif

// Framework-free CUDA launchers (implemented in sampled_kernels.cu.cc).
//
// All pointers are device pointers except `bad_positions` (host, two int64).
// `stream` is a `cudaStream_t` passed as `void*`.  `error_scratch` is a
// device buffer of at least two int64 that the launcher may overwrite.
//
// Each launcher enqueues its work on `stream`, copies the range-check result
// back, synchronises the stream and returns a `cudaError_t` as int (0 =
// cudaSuccess).  On return
//   bad_positions[0] = -1, or the smallest flat position i * c + j of an entry
//                      of `candidates` outside [0, num_labels);
//   bad_positions[1] = -1, or the smallest flat position r * fan_in + k of an
//                      entry of `indices` outside [0, num_features) among the
//                      label rows the launcher read.
// When either is >= 0 the outputs are unspecified and must not be used.  A bad
// entry is recorded, never used as an address.
//
// Every launcher range-checks every candidate.  Rows of `indices` are read
// (and checked) only where they are used: the forward reads the row of every
// candidate, the gradients only those whose `backward` entry is non-zero.

// scores[i, j] = sum_k features[i, indices[r, k]] * weights[r, k],
// r = candidates[i, j].
int XmcSampledForwardGpuF32(const float* features, const int32_t* indices,
                            const float* weights, const int32_t* candidates,
                            float* scores, int64_t batch, int64_t num_features,
                            int64_t num_labels, int64_t fan_in,
                            int64_t num_candidates, int64_t* error_scratch,
                            int64_t* bad_positions, void* stream);

// grad_features[i, indices[r, k]] += backward[i, j] * weights[r, k],
// r = candidates[i, j]; a zero backward[i, j] skips the pair without reading
// indices or weights.  `grad_features` [batch, num_features] is fully written
// (zeroed first by the launcher).
int XmcSampledGradFeaturesGpuF32(const float* backward, const int32_t* indices,
                                 const float* weights,
                                 const int32_t* candidates,
                                 float* grad_features, int64_t batch,
                                 int64_t num_features, int64_t num_labels,
                                 int64_t fan_in, int64_t num_candidates,
                                 int64_t* error_scratch,
                                 int64_t* bad_positions, void* stream);

// grad_values[i * c + j, k] = backward[i, j] * features[i, indices[r, k]],
// r = candidates[i, j]; a zero backward[i, j] writes a zero row without
// reading indices or features.  `grad_values` [batch * c, fan_in] is fully
// written.
int XmcSampledGradWeightsGpuF32(const float* backward, const float* features,
                                const int32_t* indices,
                                const int32_t* candidates, float* grad_values,
                                int64_t batch, int64_t num_features,
                                int64_t num_labels, int64_t fan_in,
                                int64_t num_candidates, int64_t* error_scratch,
                                int64_t* bad_positions, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // XMC_TF_OPS_SAMPLED_SAMPLED_KERNELS_H_
