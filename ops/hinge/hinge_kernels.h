// Shared functor header of the fused squared-hinge op family
// (Xmc>SquaredHingeLoss, Xmc>SquaredHingeLossGrad).
//
// Layout:
//   scores    [batch, num_labels]   float32, row-major
//   labels    [batch, n]            int32 or int64: the positive label ids of
//                                   each row, padded with -1; every entry in
//                                   [-1, num_labels); a repeated id counts once
//   upstream  [batch]               float32 (the gradient of the loss rows)
//   loss      [batch]               float32
//   grad      [batch, num_labels]   float32
//
// With s_ij = +1 when j is among labels[i, :] and -1 otherwise:
//   loss[i]    = sum_j relu(margin - s_ij * scores[i, j])^2
//   grad[i, j] = -2 s_ij relu(margin - s_ij * scores[i, j]) * upstream[i]
// and grad[i, j] is exactly 0 where the margin holds (s_ij scores_ij >=
// margin), whatever upstream[i] is: the uniform-sparse backward kernels skip
// exact zeros (Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 2 eq. 2 and Sec. 3.3).
//
// Both kernels are one dense pass over the row that treats every label as a
// negative, then a pass over the row's O(n) label ids that corrects the
// positives: the loss adds relu(margin - x)^2 - relu(margin + x)^2 once per
// distinct id, the gradient overwrites grad[i, id] (idempotent, so repeated
// ids need no care).  No [batch, num_labels] temporary besides the gradient
// output exists.
//
// This header is included by the TensorFlow kernels (g++) and by the
// framework-free CUDA launchers (nvcc): it must not include TensorFlow.
#ifndef XMC_TF_OPS_HINGE_HINGE_KERNELS_H_
#define XMC_TF_OPS_HINGE_HINGE_KERNELS_H_

#include <cstdint>

#include "ops/common/device.h"

// The scalar functors below are shared by the CPU kernels and the CUDA
// kernels (compiled for both host and device by nvcc).
#ifdef __CUDACC__
#define XMC_HINGE_HD __host__ __device__ __forceinline__
#else
#define XMC_HINGE_HD inline
#endif

namespace xmc_tf {
namespace hinge {

// Columns per unit of CPU work (one (row, block) pair; 64 KiB of scores).
// Fixed, so the loss's summation order does not depend on the thread count.
constexpr int64_t kCpuBlock = 16384;
// Columns per CUDA block of the loss's dense pass (256 threads x 32).
constexpr int64_t kGpuBlock = 8192;

// relu(d), with NaN propagated (as std::max(d, 0.0f)).
XMC_HINGE_HD float Relu(float d) { return d < 0.0f ? 0.0f : d; }

XMC_HINGE_HD float SquaredRelu(float d) {
  const float h = Relu(d);
  return h * h;
}

// The gradient of one negative (s = -1) with score x, scale = 2 upstream:
// exactly 0 where margin + x <= 0.
XMC_HINGE_HD float NegativeGrad(float x, float margin, float scale) {
  const float d = margin + x;
  return d > 0.0f ? scale * d : 0.0f;
}

#if defined(__GNUC__) && !defined(__CUDACC__)
// Four floats as one GCC/Clang vector (an SSE register on baseline x86-64).
// The loops below are written with it because GCC does not if-convert
// (hence not vectorise) `d > 0 ? scale * d : 0` or the NaN-keeping relu
// without -ffast-math (-ftrapping-math): they ran scalar with a branch per
// entry, 6x slower on random scores.
#define XMC_HINGE_VECTOR 1
typedef float HingeVec4 __attribute__((vector_size(16)));
inline HingeVec4 LoadVec4(const float* p) {
  HingeVec4 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreVec4(float* p, HingeVec4 v) {
  __builtin_memcpy(p, &v, sizeof(v));
}
#else
#define XMC_HINGE_VECTOR 0
#endif

// sum_j relu(margin + x[j])^2 over x[0:n]: every label a negative.  Sixteen
// float partial sums (four vectors), combined in a fixed order in float64.
inline double NegativeSquaredHingeSum(const float* x, int64_t n,
                                      float margin) {
  int64_t j = 0;
  double sum = 0.0;
#if XMC_HINGE_VECTOR
  const HingeVec4 zero = {};
  HingeVec4 acc[4] = {zero, zero, zero, zero};
  for (; j + 16 <= n; j += 16) {
    for (int v = 0; v < 4; ++v) {
      HingeVec4 d = LoadVec4(x + j + 4 * v) + margin;
      d = d < zero ? zero : d;  // relu; NaN stays NaN
      acc[v] += d * d;
    }
  }
  for (int v = 0; v < 4; ++v) {
    for (int l = 0; l < 4; ++l) sum += acc[v][l];
  }
#endif
  for (; j < n; ++j) sum += SquaredRelu(margin + x[j]);
  return sum;
}

// out[j] = 2 relu(margin + x[j]) * upstream over x[0:n] (every label a
// negative: s = -1); exactly 0 where margin + x[j] <= 0.
inline void NegativeSquaredHingeGrad(const float* x, int64_t n, float margin,
                                     float upstream, float* out) {
  const float scale = 2.0f * upstream;
  int64_t j = 0;
#if XMC_HINGE_VECTOR
  const HingeVec4 zero = {};
  for (; j + 4 <= n; j += 4) {
    const HingeVec4 d = LoadVec4(x + j) + margin;
    StoreVec4(out + j, d > zero ? d * scale : zero);
  }
#endif
  for (; j < n; ++j) out[j] = NegativeGrad(x[j], margin, scale);
}

// The loss correction of one positive with score x: its term as a positive
// minus the term the dense pass gave it as a negative.
XMC_HINGE_HD double PositiveLossCorrection(float x, float margin) {
  return static_cast<double>(SquaredRelu(margin - x)) -
         static_cast<double>(SquaredRelu(margin + x));
}

// The gradient of one positive with score x (s = +1).
XMC_HINGE_HD float PositiveGrad(float x, float margin, float upstream) {
  const float d = margin - x;
  return d > 0.0f ? -2.0f * d * upstream : 0.0f;
}

}  // namespace hinge
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// The functors of the two op kernels (ops/common/device.h): one OpKernel
// class per op, templated on the device, checks ranks and shapes and
// allocates the output, then calls functor::X<Device, T, TL> (T = the
// scores' type, TL = int32_t or int64_t label ids).  CpuDevice:
// hinge_kernels.cc (TensorFlow's intra-op pool), T = float, Eigen::half and
// Eigen::bfloat16, the narrow types widened to float block by block (the
// same float computation as on their float32 values; the gradient rounded
// once to T, the loss and upstream float32 for every T); GpuDevice:
// hinge_kernels.cc behind XMC_TF_WITH_CUDA, T = float only, calling the
// launchers below on TensorFlow's stream.  The functors range-check every
// label id (CPU on the host, GPU on the device) and fail `ctx` with
// InvalidArgument naming the first bad entry.

namespace xmc_tf {

// Sizes of one call; `blocks` = ceil(num_labels / kCpuBlock).
struct HingeDims {
  int64_t batch = 0, num_labels = 0, n = 0, blocks = 0;
};

namespace functor {

// loss [batch] (float32) from scores [batch, num_labels] and labels
// [batch, n].
template <typename Device, typename T, typename TL>
struct SquaredHingeLoss {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* scores,
                  const TL* labels, const HingeDims& d, float margin,
                  float* loss) const;
};

// grad [batch, num_labels] (T, fully written) from scores, labels and
// upstream [batch] (float32).
template <typename Device, typename T, typename TL>
struct SquaredHingeLossGrad {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* scores,
                  const TL* labels, const float* upstream, const HingeDims& d,
                  float margin, T* grad) const;
};

}  // namespace functor
}  // namespace xmc_tf

#ifdef __cplusplus
extern "C" {
#endif

// Framework-free CUDA launchers (implemented in hinge_kernels.cu.cc),
// float32 scores; `labels` is int64 when `labels_int64` is non-zero, else
// int32.
//
// All pointers are device pointers except `bad_position` (host, one int64).
// `stream` is a `cudaStream_t` passed as `void*`.  `error_scratch` is a
// device buffer of at least one int64 that the launcher may overwrite.
// Each launcher enqueues its work on `stream`, copies the range-check result
// back, synchronises the stream and returns a `cudaError_t` as int (0 =
// cudaSuccess).  On return *bad_position = -1, or the smallest flat position
// i * n + k of an entry of `labels` outside [-1, num_labels); the outputs
// are then unspecified.  A bad entry is recorded, never used as an address.

// Device floats of `partial_scratch` that XmcSquaredHingeLossGpuF32 needs:
// batch * ceil(num_labels / kGpuBlock) (at least 1).
int64_t XmcSquaredHingeLossScratchFloats(int64_t batch, int64_t num_labels);

// loss[i] = sum_j relu(margin - s_ij scores[i, j])^2.  Deterministic: fixed
// blocks of kGpuBlock columns, each reduced in a fixed order, then summed
// per row in block order.
int XmcSquaredHingeLossGpuF32(const float* scores, const void* labels,
                              int labels_int64, float* loss, int64_t batch,
                              int64_t num_labels, int64_t n, float margin,
                              float* partial_scratch, int64_t* error_scratch,
                              int64_t* bad_position, void* stream);

// grad[i, j] = -2 s_ij relu(margin - s_ij scores[i, j]) * upstream[i];
// `grad` [batch, num_labels] is fully written.
int XmcSquaredHingeLossGradGpuF32(const float* scores, const void* labels,
                                  int labels_int64, const float* upstream,
                                  float* grad, int64_t batch,
                                  int64_t num_labels, int64_t n, float margin,
                                  int64_t* error_scratch,
                                  int64_t* bad_position, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // XMC_TF_OPS_HINGE_HINGE_KERNELS_H_
