// Shared part of the framework-free CUDA launchers of the uniform-sparse
// op family (nvcc only; no TensorFlow): the tiling constants, the device
// helpers (value loads / stores, the transposing and converting kernels,
// the connection loads with their range check) and the host helpers of
// the launch (rows per lane, grid split, workspace layout, the enqueue of
// the index check, transpose and conversion).  Device code is inline or a
// template here; the non-template host helpers and the index-check kernel
// are in uniform_sparse_cuda_common.cu.cc.  The design is described in
// uniform_sparse_kernels.cu.cc (the gradient launchers); the forward
// launchers are in uniform_sparse_cuda_forward.cu.cc.
#ifndef XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CUDA_COMMON_H_
#define XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CUDA_COMMON_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ops/common/cuda_launch.h"

namespace xmc_tf {
namespace uniform_sparse_cuda {

using cuda::CeilDiv;
using cuda::kFullMask;
using cuda::kWarpSize;
using cuda::RecordBad;

constexpr int kWarps = 8;                       // warps per block
constexpr int kThreads = kWarps * kWarpSize;    // 256
constexpr int kLabels = kWarpSize;              // labels per block tile
constexpr int kStride = kLabels + 1;            // shared tile row stride
constexpr int kMaxRows = 8;                     // max instance rows per lane
constexpr int kLd = kWarpSize;                  // features_t row alignment
constexpr int64_t kAlign = 256;                 // workspace part alignment
// Resident blocks per SM aimed at when splitting instance tiles over y.
constexpr int kBlocksPerSmTarget = 8;
constexpr int64_t kMaxGridY = 65535;

__host__ __device__ inline int64_t Min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__host__ __device__ inline int64_t Max64(int64_t a, int64_t b) {
  return a < b ? b : a;
}
inline int64_t AlignUp(int64_t x, int64_t a) { return CeilDiv(x, a) * a; }

__device__ __forceinline__ bool InRange(int32_t idx, int64_t num_features) {
  return idx >= 0 && static_cast<int64_t>(idx) < num_features;
}

// Loads as float / stores from float, for each value type.
__device__ __forceinline__ float Load(const float* p) { return __ldg(p); }
__device__ __forceinline__ float Load(const __half* p) {
  return __half2float(__ldg(p));
}
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// out[c * ld_out + r] = in[r * ld_in + c] for r < rows, c < cols, converted
// to Out (32 x 32 tiles through shared memory; both sides coalesced).
// Block (32, 8); grid x over column tiles, y (grid-stride) over row tiles.
template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    TransposeKernel(const In* __restrict__ in, int64_t rows, int64_t cols,
                    int64_t ld_in, Out* __restrict__ out, int64_t ld_out) {
  __shared__ float tile[kWarpSize][kWarpSize + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kWarpSize;
  const int64_t row_tiles = CeilDiv(rows, kWarpSize);
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kWarpSize;
    for (int dy = threadIdx.y; dy < kWarpSize; dy += blockDim.y) {
      const int64_t r = r0 + dy, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[dy][threadIdx.x] = Load(in + r * ld_in + c);
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < kWarpSize; dy += blockDim.y) {
      const int64_t c = c0 + dy, r = r0 + threadIdx.x;
      if (r < rows && c < cols) {
        out[c * ld_out + r] = FromFloat<Out>(tile[threadIdx.x][dy]);
      }
    }
    __syncthreads();
  }
}

// out[p] = in[p] converted, p < total (grid-stride).
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    ConvertKernel(const float* __restrict__ in, int64_t total,
                  Out* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       p < total; p += stride) {
    out[p] = FromFloat<Out>(in[p]);
  }
}

// Loads connections [kc, kc + 32) of the label whose first connection is at
// flat position `row`: lane l gets (index, weight) of connection kc + l, or
// (0, 0) past fan_in or for an out-of-range index (recorded).
template <typename T, bool kWithWeights>
__device__ __forceinline__ void LoadConnections(
    const int32_t* __restrict__ indices, const T* __restrict__ weights,
    int64_t row, int64_t kc, int64_t fan_in, int64_t num_features, int lane,
    int32_t* idx, float* w, int64_t* __restrict__ error_scratch) {
  *idx = 0;
  *w = 0.0f;
  const int64_t k = kc + lane;
  if (k < fan_in) {
    const int32_t raw = __ldg(indices + row + k);
    if (InRange(raw, num_features)) {
      *idx = raw;
      if (kWithWeights) *w = Load(weights + row + k);
    } else {
      RecordBad(error_scratch, row + k);
    }
  }
}

// ---------------------------------------------------------------------------
// Host side (uniform_sparse_cuda_common.cu.cc, except the templates).

// Rows per lane for a batch: the smallest of 1, 2, 4, 8 whose tile (32 * R
// instances) covers the batch, 8 beyond 256 instances.
int RowsPerLane(int64_t batch);

// Instance-tile groups over gridDim.y so that about kBlocksPerSmTarget
// blocks per SM exist.
int64_t SplitTiles(int64_t label_tiles, int64_t instance_tiles, int num_sms);

// Enqueues the range check of every entry of indices [total] against
// [0, num_features) (bad positions recorded in error_scratch).
cudaError_t EnqueueValidate(const int32_t* indices, int64_t total,
                            int64_t num_features, int num_sms,
                            int64_t* error_scratch, cudaStream_t stream);

template <typename In, typename Out>
cudaError_t EnqueueTranspose(const In* in, int64_t rows, int64_t cols,
                             int64_t ld_in, Out* out, int64_t ld_out,
                             cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t col_tiles = CeilDiv(cols, kWarpSize);
  if (col_tiles > INT_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(col_tiles),
                  static_cast<unsigned>(
                      Min64(CeilDiv(rows, kWarpSize), kMaxGridY)));
  TransposeKernel<In, Out><<<grid, dim3(kWarpSize, kWarps), 0, stream>>>(
      in, rows, cols, ld_in, out, ld_out);
  return cudaGetLastError();
}

template <typename Out>
cudaError_t EnqueueConvert(const float* in, int64_t total, Out* out,
                           int num_sms, cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  const unsigned blocks =
      cuda::Grid1d(CeilDiv(total, kThreads),
                   static_cast<int64_t>(num_sms) * kBlocksPerSmTarget * 4);
  ConvertKernel<Out><<<blocks, kThreads, 0, stream>>>(in, total, out);
  return cudaGetLastError();
}

// The workspace parts (byte offsets from the workspace start) of a launch.
struct Workspace {
  int64_t ld = 0;
  int64_t features_t = -1, grad_features_t = -1, grad_weights_acc = -1;
  int64_t bytes = 0;
};

// kind: 0 forward, 1 grad features, 2 grad weights, 3 both gradients.
Workspace PlanWorkspace(int kind, int value_bytes, int64_t batch,
                        int64_t num_features, int64_t num_labels,
                        int64_t fan_in);

template <typename T>
T* Part(void* workspace, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(workspace) + offset);
}

}  // namespace uniform_sparse_cuda
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_UNIFORM_SPARSE_UNIFORM_SPARSE_CUDA_COMMON_H_
