// Framework-free CUDA launchers of the fused squared-hinge family (float32
// scores, int32 or int64 label ids).
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 2 eq. 2 and Sec. 3.3.  The contract
// (layout, error reporting) is in hinge_kernels.h, whose scalar functors
// (SquaredRelu, NegativeGrad, PositiveLossCorrection, PositiveGrad) are the
// ones the CPU kernels use.  No TensorFlow header: builds with nvcc alone
// and can be called through ctypes (tools/build_cuda_harness.py).
//
// Notation: b = batch, m = num_labels, n = ids per row.
//
// Loss (two kernels, deterministic):
//  1. NegativePartialKernel: a 2-D grid of (column block, row) with grid-
//     stride loops over both; a block of 256 threads sums
//     relu(margin + scores)^2 over kGpuBlock = 8192 columns of one row
//     (coalesced loads, each thread a fixed set of columns), reduces with
//     warp shuffles and a fixed-order sum of the warp totals, and writes one
//     partial per (row, column block).
//  2. FinishLossKernel: one block per row (grid-stride over rows): every
//     thread range-checks its ids and adds the positive correction of each
//     id not repeated earlier in the row (an O(n) look-back per id: n is the
//     padded number of positives, small); thread 0 adds the row's partials
//     in block order (float64).
// Gradient (two kernels on the same stream):
//  1. NegativeGradKernel: grid-stride over (row, column), every entry the
//     gradient of a negative (exactly 0 where the margin holds).
//  2. PositiveGradKernel: grid-stride over the b * n ids; a valid id
//     overwrites its entry with the positive gradient (repeated ids write
//     the same value).
// Bad ids (outside [-1, m)) are recorded with atomicMin of the flat position
// i * n + k and never used as addresses.

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/cuda_launch.h"
#include "ops/hinge/hinge_kernels.h"

namespace xmc_tf {
namespace hinge_cuda {
namespace {

using cuda::CeilDiv;
using cuda::Grid1d;
using cuda::kFullMask;
using cuda::kWarpSize;
using cuda::RecordBad;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxGridY = 65535;
constexpr int kBlocksPerSm = 32;  // upper bound of 1-D grids, per SM

template <typename TL>
__device__ __forceinline__ int64_t LoadId(const TL* labels, int64_t p) {
  return static_cast<int64_t>(__ldg(labels + p));
}

// Sum of `value` over the block, in a fixed order; valid in thread 0.
template <typename T>
__device__ T BlockSum(T value, T* shared /* [kWarps] */) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    value += __shfl_down_sync(kFullMask, value, offset);
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  T total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) total += shared[w];
  }
  __syncthreads();  // `shared` may be reused by the next call
  return total;
}

__global__ void __launch_bounds__(kThreads)
    NegativePartialKernel(const float* __restrict__ scores,
                          float* __restrict__ partial, int64_t batch,
                          int64_t num_labels, int64_t col_blocks,
                          float margin) {
  __shared__ float warp_sums[kWarps];
  for (int64_t i = blockIdx.y; i < batch; i += gridDim.y) {
    const float* row = scores + i * num_labels;
    for (int64_t cb = blockIdx.x; cb < col_blocks; cb += gridDim.x) {
      const int64_t j0 = cb * hinge::kGpuBlock;
      int64_t j1 = j0 + hinge::kGpuBlock;
      if (j1 > num_labels) j1 = num_labels;
      float acc = 0.0f;
      for (int64_t j = j0 + threadIdx.x; j < j1; j += kThreads) {
        acc += hinge::SquaredRelu(margin + __ldg(row + j));
      }
      const float total = BlockSum(acc, warp_sums);
      if (threadIdx.x == 0) partial[i * col_blocks + cb] = total;
    }
  }
}

template <typename TL>
__global__ void __launch_bounds__(kThreads)
    FinishLossKernel(const float* __restrict__ scores,
                     const TL* __restrict__ labels,
                     const float* __restrict__ partial,
                     float* __restrict__ loss, int64_t batch,
                     int64_t num_labels, int64_t n, int64_t col_blocks,
                     float margin, int64_t* __restrict__ error_scratch) {
  __shared__ double warp_sums[kWarps];
  for (int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
    const TL* ids = labels + i * n;
    const float* row = scores + i * num_labels;
    double corr = 0.0;
    for (int64_t k = threadIdx.x; k < n; k += kThreads) {
      const int64_t id = LoadId(ids, k);
      if (id < -1 || id >= num_labels) {
        RecordBad(error_scratch, i * n + k);
        continue;
      }
      if (id < 0) continue;
      bool first = true;
      for (int64_t q = 0; q < k && first; ++q) first = LoadId(ids, q) != id;
      if (first) corr += hinge::PositiveLossCorrection(__ldg(row + id), margin);
    }
    const double total_corr = BlockSum(corr, warp_sums);
    if (threadIdx.x == 0) {
      double sum = 0.0;
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        sum += partial[i * col_blocks + cb];
      }
      loss[i] = static_cast<float>(sum + total_corr);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    NegativeGradKernel(const float* __restrict__ scores,
                       const float* __restrict__ upstream,
                       float* __restrict__ grad, int64_t batch,
                       int64_t num_labels, float margin) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = blockIdx.y; i < batch; i += gridDim.y) {
    const float scale = 2.0f * __ldg(upstream + i);
    const float* row = scores + i * num_labels;
    float* out = grad + i * num_labels;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
         j < num_labels; j += stride) {
      out[j] = hinge::NegativeGrad(__ldg(row + j), margin, scale);
    }
  }
}

template <typename TL>
__global__ void __launch_bounds__(kThreads)
    PositiveGradKernel(const float* __restrict__ scores,
                       const TL* __restrict__ labels,
                       const float* __restrict__ upstream,
                       float* __restrict__ grad, int64_t total, int64_t n,
                       int64_t num_labels, float margin,
                       int64_t* __restrict__ error_scratch) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       p < total; p += stride) {
    const int64_t id = LoadId(labels, p);
    if (id < -1 || id >= num_labels) {
      RecordBad(error_scratch, p);
      continue;
    }
    if (id < 0) continue;
    const int64_t at = (p / n) * num_labels + id;
    grad[at] = hinge::PositiveGrad(__ldg(scores + at), margin,
                                   __ldg(upstream + p / n));
  }
}

// ---------------------------------------------------------------------------
// Host helpers.

// A 2-D grid: x over `x_units` (capped so the grid has at most `cap`
// blocks), y over rows (at most kMaxGridY).
dim3 Grid2d(int64_t x_units, int64_t rows, int64_t cap) {
  const int64_t y = rows < kMaxGridY ? rows : kMaxGridY;
  int64_t x = x_units;
  const int64_t x_cap = cap / y > 0 ? cap / y : 1;
  if (x > x_cap) x = x_cap;
  if (x < 1) x = 1;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y < 1 ? 1 : y));
}

template <typename TL>
cudaError_t EnqueueLoss(const float* scores, const TL* labels, float* loss,
                        int64_t batch, int64_t num_labels, int64_t n,
                        float margin, float* partial, int64_t* error_scratch,
                        int64_t cap, cudaStream_t stream) {
  const int64_t col_blocks = CeilDiv(num_labels, hinge::kGpuBlock);
  if (col_blocks > 0) {
    NegativePartialKernel<<<Grid2d(col_blocks, batch, cap), kThreads, 0,
                            stream>>>(scores, partial, batch, num_labels,
                                      col_blocks, margin);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  FinishLossKernel<TL><<<Grid1d(batch, cap), kThreads, 0, stream>>>(
      scores, labels, partial, loss, batch, num_labels, n, col_blocks, margin,
      error_scratch);
  return cudaGetLastError();
}

template <typename TL>
cudaError_t EnqueueGrad(const float* scores, const TL* labels,
                        const float* upstream, float* grad, int64_t batch,
                        int64_t num_labels, int64_t n, float margin,
                        int64_t* error_scratch, int64_t cap,
                        cudaStream_t stream) {
  if (num_labels > 0) {
    NegativeGradKernel<<<Grid2d(CeilDiv(num_labels, kThreads), batch, cap),
                         kThreads, 0, stream>>>(scores, upstream, grad, batch,
                                                num_labels, margin);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t total = batch * n;
  if (total == 0) return cudaSuccess;
  PositiveGradKernel<TL><<<Grid1d(CeilDiv(total, kThreads), cap), kThreads, 0,
                           stream>>>(scores, labels, upstream, grad, total, n,
                                     num_labels, margin, error_scratch);
  return cudaGetLastError();
}

}  // namespace
}  // namespace hinge_cuda
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// Launchers (extern "C", declared in hinge_kernels.h).

using namespace xmc_tf::hinge_cuda;  // NOLINT(build/namespaces)
using xmc_tf::cuda::RunWithChecks;

extern "C" int64_t XmcSquaredHingeLossScratchFloats(int64_t batch,
                                                    int64_t num_labels) {
  const int64_t floats = batch * CeilDiv(num_labels, xmc_tf::hinge::kGpuBlock);
  return floats > 0 ? floats : 1;
}

namespace {

// The common part of both launchers: size checks, the grid cap, the range
// check round trip; `enqueue(labels_as_TL, cap)` enqueues the kernels.
template <typename Enqueue>
int Launch(const void* labels, int labels_int64, int64_t batch,
           int64_t num_labels, int64_t n, int64_t* error_scratch,
           int64_t* bad_position, void* stream_ptr, Enqueue enqueue) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  *bad_position = -1;
  if (batch < 0 || num_labels < 0 || n < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (batch == 0) return static_cast<int>(cudaSuccess);
  int64_t cap = 0;
  const cudaError_t err = xmc_tf::cuda::MaxBlocks(kBlocksPerSm, &cap);
  if (err != cudaSuccess) return static_cast<int>(err);
  return RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
    return labels_int64 ? enqueue(static_cast<const int64_t*>(labels), cap,
                                  stream)
                        : enqueue(static_cast<const int32_t*>(labels), cap,
                                  stream);
  });
}

}  // namespace

extern "C" int XmcSquaredHingeLossGpuF32(
    const float* scores, const void* labels, int labels_int64, float* loss,
    int64_t batch, int64_t num_labels, int64_t n, float margin,
    float* partial_scratch, int64_t* error_scratch, int64_t* bad_position,
    void* stream_ptr) {
  return Launch(labels, labels_int64, batch, num_labels, n, error_scratch,
                bad_position, stream_ptr,
                [&](auto ids, int64_t cap, cudaStream_t stream) {
                  return EnqueueLoss(scores, ids, loss, batch, num_labels, n,
                                     margin, partial_scratch, error_scratch,
                                     cap, stream);
                });
}

extern "C" int XmcSquaredHingeLossGradGpuF32(
    const float* scores, const void* labels, int labels_int64,
    const float* upstream, float* grad, int64_t batch, int64_t num_labels,
    int64_t n, float margin, int64_t* error_scratch, int64_t* bad_position,
    void* stream_ptr) {
  return Launch(labels, labels_int64, batch, num_labels, n, error_scratch,
                bad_position, stream_ptr,
                [&](auto ids, int64_t cap, cudaStream_t stream) {
                  return EnqueueGrad(scores, ids, upstream, grad, batch,
                                     num_labels, n, margin, error_scratch,
                                     cap, stream);
                });
}
