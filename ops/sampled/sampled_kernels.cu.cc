// Framework-free CUDA launchers of the sampled-scoring op family (float32).
//
// Sources: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3 (uniform-sparse layer,
// zero-skipping backward, warp-level work assignment); Mehta et al., ASTRA,
// Algorithm 1 (score positives plus sampled negatives only).  The contract
// (layout, error reporting) is in sampled_kernels.h; this file includes no
// TensorFlow header so that it builds with nvcc alone and can be called
// through ctypes (tools/build_cuda_harness.py with this source).
//
// Notation: b = batch, e = num_features, m = num_labels, s = fan_in,
// c = num_candidates; a position p = i * c + j is one (instance, candidate)
// pair, P = b * c positions.  Offsets are int64.
//
// Work assignment (all three kernels): a *group* of G = min(32,
// next_pow2(s)) consecutive lanes handles one position; a warp handles
// 32 / G consecutive positions per step and strides over the positions
// (grid-stride loop, the trip count is uniform within a warp so that the
// forward's shuffles see every lane).  Within a group, lane `sub` takes
// connections k = sub, sub + G, ...: for s >= 32 a warp reads the label's
// 32 indices / weights with one coalesced 128-byte load each (label rows
// are contiguous in the label-major layout), and the weight-gradient
// values row i * c + j is written with coalesced stores.  The gathers
// features[i, indices[r, k]] hit one feature row (e floats), which
// consecutive positions share (the c candidates of instance i are
// consecutive), so they are served by L1/L2.
//
// * Forward: per-lane partial sums, reduced within the group with
//   __shfl_xor_sync (offsets < G stay inside the aligned group).
// * Gradient w.r.t. features: a zero backward[i, j] skips the position (no
//   load of the label row); otherwise atomicAdd of g * weights[r, k] into
//   grad_features[i, indices[r, k]] (zeroed with cudaMemsetAsync first;
//   candidates of one instance may share connections, hence atomics).
// * Gradient w.r.t. weights: a zero backward[i, j] writes a zero row without
//   loading the label row or the features; otherwise g * features[i, idx].
//
// Range checks: every candidate is checked (bad_positions[0], flat position
// i * c + j); every index that is loaded is checked (bad_positions[1], flat
// position r * s + k).  Bad entries are recorded with atomicMin (so the
// smallest position is reported) and never used as addresses.

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/cuda_launch.h"
#include "ops/sampled/sampled_kernels.h"

namespace xmc_tf {
namespace sampled_cuda {
namespace {

using cuda::CeilDiv;
using cuda::kFullMask;
using cuda::kWarpSize;
using cuda::RecordBad;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kBlocksPerSm = 32;  // upper bound of the grid, per SM
__device__ __forceinline__ bool InRange(int64_t value, int64_t bound) {
  return value >= 0 && value < bound;
}

// Lane layout of a group-per-position kernel.
struct Groups {
  int group;        // lanes per position, G
  int sub;          // lane within the group
  int64_t first;    // first position of this group
  int64_t stride;   // positions per grid step
  int64_t warp_first;  // first position of this warp (uniform in the warp)
};

__device__ __forceinline__ Groups MakeGroups(int log2_group) {
  Groups g;
  const int lane = threadIdx.x % kWarpSize;
  const int per_warp = kWarpSize >> log2_group;
  g.group = 1 << log2_group;
  g.sub = lane & (g.group - 1);
  const int64_t warp =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
      kWarpSize;
  g.warp_first = warp * per_warp;
  g.first = g.warp_first + (lane >> log2_group);
  g.stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize) *
             per_warp;
  return g;
}

// ---------------------------------------------------------------------------
// Kernels.

__global__ void __launch_bounds__(kThreads)
    SampledForwardKernel(const float* __restrict__ features,
                         const int32_t* __restrict__ indices,
                         const float* __restrict__ weights,
                         const int32_t* __restrict__ candidates,
                         float* __restrict__ scores, int64_t total,
                         int64_t num_candidates, int64_t num_features,
                         int64_t num_labels, int64_t fan_in, int log2_group,
                         int64_t* __restrict__ error_scratch) {
  const Groups g = MakeGroups(log2_group);
  // warp_first + step is uniform within the warp: every lane runs the same
  // number of iterations and takes part in every shuffle.
  for (int64_t step = 0; g.warp_first + step < total; step += g.stride) {
    const int64_t p = g.first + step;
    float acc = 0.0f;
    if (p < total) {
      const int32_t r = __ldg(candidates + p);
      if (!InRange(r, num_labels)) {
        if (g.sub == 0) RecordBad(error_scratch, p);
      } else {
        const float* x = features + (p / num_candidates) * num_features;
        const int64_t row = static_cast<int64_t>(r) * fan_in;
        for (int64_t k = g.sub; k < fan_in; k += g.group) {
          const int32_t f = __ldg(indices + row + k);
          if (InRange(f, num_features)) {
            acc = fmaf(__ldg(x + f), __ldg(weights + row + k), acc);
          } else {
            RecordBad(error_scratch + 1, row + k);
          }
        }
      }
    }
    for (int offset = g.group >> 1; offset > 0; offset >>= 1) {
      acc += __shfl_xor_sync(kFullMask, acc, offset);
    }
    if (p < total && g.sub == 0) scores[p] = acc;
  }
}

__global__ void __launch_bounds__(kThreads)
    SampledGradFeaturesKernel(const float* __restrict__ backward,
                              const int32_t* __restrict__ indices,
                              const float* __restrict__ weights,
                              const int32_t* __restrict__ candidates,
                              float* __restrict__ grad_features, int64_t total,
                              int64_t num_candidates, int64_t num_features,
                              int64_t num_labels, int64_t fan_in,
                              int log2_group,
                              int64_t* __restrict__ error_scratch) {
  const Groups g = MakeGroups(log2_group);
  for (int64_t p = g.first; p < total; p += g.stride) {
    const float signal = __ldg(backward + p);
    const int32_t r = __ldg(candidates + p);
    if (!InRange(r, num_labels)) {
      if (g.sub == 0) RecordBad(error_scratch, p);
      continue;
    }
    if (signal == 0.0f) continue;  // the label row is not read
    float* out = grad_features + (p / num_candidates) * num_features;
    const int64_t row = static_cast<int64_t>(r) * fan_in;
    for (int64_t k = g.sub; k < fan_in; k += g.group) {
      const int32_t f = __ldg(indices + row + k);
      if (InRange(f, num_features)) {
        atomicAdd(out + f, signal * __ldg(weights + row + k));
      } else {
        RecordBad(error_scratch + 1, row + k);
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    SampledGradWeightsKernel(const float* __restrict__ backward,
                             const float* __restrict__ features,
                             const int32_t* __restrict__ indices,
                             const int32_t* __restrict__ candidates,
                             float* __restrict__ grad_values, int64_t total,
                             int64_t num_candidates, int64_t num_features,
                             int64_t num_labels, int64_t fan_in,
                             int log2_group,
                             int64_t* __restrict__ error_scratch) {
  const Groups g = MakeGroups(log2_group);
  for (int64_t p = g.first; p < total; p += g.stride) {
    const float signal = __ldg(backward + p);
    const int32_t r = __ldg(candidates + p);
    float* out = grad_values + p * fan_in;
    const bool label_ok = InRange(r, num_labels);
    if (!label_ok && g.sub == 0) RecordBad(error_scratch, p);
    if (!label_ok || signal == 0.0f) {  // zero row, nothing else is read
      for (int64_t k = g.sub; k < fan_in; k += g.group) out[k] = 0.0f;
      continue;
    }
    const float* x = features + (p / num_candidates) * num_features;
    const int64_t row = static_cast<int64_t>(r) * fan_in;
    for (int64_t k = g.sub; k < fan_in; k += g.group) {
      const int32_t f = __ldg(indices + row + k);
      float v = 0.0f;
      if (InRange(f, num_features)) {
        v = signal * __ldg(x + f);
      } else {
        RecordBad(error_scratch + 1, row + k);
      }
      out[k] = v;
    }
  }
}

// ---------------------------------------------------------------------------
// Host helpers.

int Log2Group(int64_t fan_in) {
  int log2_group = 0;
  while (log2_group < 5 && (int64_t{1} << log2_group) < fan_in) ++log2_group;
  return log2_group;
}

cudaError_t GridFor(int64_t total, int log2_group, unsigned* blocks) {
  int64_t cap = 0;
  const cudaError_t err = cuda::MaxBlocks(kBlocksPerSm, &cap);
  if (err != cudaSuccess) return err;
  const int64_t per_block =
      static_cast<int64_t>(kWarpsPerBlock) * (kWarpSize >> log2_group);
  *blocks = cuda::Grid1d(CeilDiv(total, per_block), cap);
  return cudaSuccess;
}

// The common part of the three launchers: size checks, the zeroing of
// `zero_first` (`zero_floats` floats; null for none) before anything else,
// the grid and the range-check round trip.  `enqueue(blocks, log2_group,
// total, stream)` enqueues the kernel and returns cudaGetLastError().
// Returns a cudaError_t as int and sets bad_positions[0..1].
template <typename Enqueue>
int Launch(int64_t batch, int64_t num_features, int64_t num_labels,
           int64_t fan_in, int64_t num_candidates, float* zero_first,
           int64_t zero_floats, int64_t* error_scratch,
           int64_t* bad_positions, void* stream_ptr, const Enqueue& enqueue) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  bad_positions[0] = bad_positions[1] = -1;
  if (batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0 ||
      num_candidates < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (zero_first != nullptr && zero_floats > 0) {
    const cudaError_t err = cudaMemsetAsync(
        zero_first, 0, static_cast<size_t>(zero_floats) * sizeof(float),
        stream);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  const int64_t total = batch * num_candidates;
  if (total == 0) return static_cast<int>(cudaSuccess);
  const int log2_group = Log2Group(fan_in);
  unsigned blocks = 0;
  const cudaError_t err = GridFor(total, log2_group, &blocks);
  if (err != cudaSuccess) return static_cast<int>(err);
  return cuda::RunWithChecks<2>(error_scratch, bad_positions, stream, [&] {
    return enqueue(blocks, log2_group, total, stream);
  });
}

}  // namespace
}  // namespace sampled_cuda
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// Launchers (extern "C", declared in sampled_kernels.h).

using namespace xmc_tf::sampled_cuda;  // NOLINT(build/namespaces)

extern "C" int XmcSampledForwardGpuF32(
    const float* features, const int32_t* indices, const float* weights,
    const int32_t* candidates, float* scores, int64_t batch,
    int64_t num_features, int64_t num_labels, int64_t fan_in,
    int64_t num_candidates, int64_t* error_scratch, int64_t* bad_positions,
    void* stream_ptr) {
  return Launch(batch, num_features, num_labels, fan_in, num_candidates,
                nullptr, 0, error_scratch, bad_positions, stream_ptr,
                [&](unsigned blocks, int log2_group, int64_t total,
                    cudaStream_t stream) {
                  SampledForwardKernel<<<blocks, kThreads, 0, stream>>>(
                      features, indices, weights, candidates, scores, total,
                      num_candidates, num_features, num_labels, fan_in,
                      log2_group, error_scratch);
                  return cudaGetLastError();
                });
}

// grad_features is zeroed first (also when no position is scored).
extern "C" int XmcSampledGradFeaturesGpuF32(
    const float* backward, const int32_t* indices, const float* weights,
    const int32_t* candidates, float* grad_features, int64_t batch,
    int64_t num_features, int64_t num_labels, int64_t fan_in,
    int64_t num_candidates, int64_t* error_scratch, int64_t* bad_positions,
    void* stream_ptr) {
  return Launch(batch, num_features, num_labels, fan_in, num_candidates,
                grad_features, batch * num_features, error_scratch,
                bad_positions, stream_ptr,
                [&](unsigned blocks, int log2_group, int64_t total,
                    cudaStream_t stream) {
                  SampledGradFeaturesKernel<<<blocks, kThreads, 0, stream>>>(
                      backward, indices, weights, candidates, grad_features,
                      total, num_candidates, num_features, num_labels, fan_in,
                      log2_group, error_scratch);
                  return cudaGetLastError();
                });
}

// Runs even when fan_in == 0: the candidates are still checked.
extern "C" int XmcSampledGradWeightsGpuF32(
    const float* backward, const float* features, const int32_t* indices,
    const int32_t* candidates, float* grad_values, int64_t batch,
    int64_t num_features, int64_t num_labels, int64_t fan_in,
    int64_t num_candidates, int64_t* error_scratch, int64_t* bad_positions,
    void* stream_ptr) {
  return Launch(batch, num_features, num_labels, fan_in, num_candidates,
                nullptr, 0, error_scratch, bad_positions, stream_ptr,
                [&](unsigned blocks, int log2_group, int64_t total,
                    cudaStream_t stream) {
                  SampledGradWeightsKernel<<<blocks, kThreads, 0, stream>>>(
                      backward, features, indices, candidates, grad_values,
                      total, num_candidates, num_features, num_labels, fan_in,
                      log2_group, error_scratch);
                  return cudaGetLastError();
                });
}
