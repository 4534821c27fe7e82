// Framework-free CUDA launchers of the uniform-sparse forward (Algorithm 1;
// float32, float16 and bfloat16 values, float32 accumulation):
// XmcUniformSparseForwardGpu* of uniform_sparse_kernels.h.  The design
// (transposed features, label tiles, shared-memory staging, index checks)
// is described in uniform_sparse_kernels.cu.cc; the shared helpers are in
// uniform_sparse_cuda_common.h.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "ops/common/cuda_launch.h"
#include "ops/uniform_sparse/uniform_sparse_cuda_common.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"

namespace xmc_tf {
namespace uniform_sparse_cuda {
namespace {

// ---------------------------------------------------------------------------
// Forward (Algorithm 1; see the file comment of
// uniform_sparse_kernels.cu.cc).
//
// Grid: x = label tiles of 32, y = groups of instance tiles (tile t goes to
// blockIdx.y = t mod gridDim.y).  Block: kThreads.  R: rows per lane.

template <typename T, int R>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* __restrict__ features_t, int64_t ld,
                  const int32_t* __restrict__ indices,
                  const T* __restrict__ weights, T* __restrict__ scores,
                  int64_t batch, int64_t num_features, int64_t num_labels,
                  int64_t fan_in, int64_t* __restrict__ error_scratch) {
  constexpr int kTileRows = kWarpSize * R;
  __shared__ float tile[kTileRows][kStride];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int64_t label_begin = static_cast<int64_t>(blockIdx.x) * kLabels;
  const int64_t tiles = CeilDiv(batch, kTileRows);

  for (int64_t t = blockIdx.y; t < tiles; t += gridDim.y) {
    const int64_t i0 = t * kTileRows;
    const int64_t rows_here = Min64(kTileRows, batch - i0);
    for (int jj = warp; jj < kLabels; jj += kWarps) {
      const int64_t j = label_begin + jj;
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.0f;
      if (j < num_labels) {  // uniform within the warp
        const int64_t row = j * fan_in;
        const T* base = features_t + i0 + lane;
        for (int64_t kc = 0; kc < fan_in; kc += kWarpSize) {
          int32_t idx;
          float w;
          LoadConnections<T, true>(indices, weights, row, kc, fan_in,
                                   num_features, lane, &idx, &w,
                                   error_scratch);
          const int n = static_cast<int>(Min64(kWarpSize, fan_in - kc));
#pragma unroll 4
          for (int q = 0; q < n; ++q) {
            const int64_t it = __shfl_sync(kFullMask, idx, q);
            const float wt = __shfl_sync(kFullMask, w, q);
            const T* line = base + it * ld;
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if (lane + kWarpSize * r < rows_here) {
                acc[r] = fmaf(Load(line + kWarpSize * r), wt, acc[r]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) tile[lane + kWarpSize * r][jj] = acc[r];
    }
    __syncthreads();
    const int64_t j = label_begin + lane;
    if (j < num_labels) {
      for (int64_t r = warp; r < rows_here; r += kWarps) {
        scores[(i0 + r) * num_labels + j] = FromFloat<T>(tile[r][lane]);
      }
    }
    __syncthreads();  // the tile is rewritten by the next instance tile
  }
}

// ---------------------------------------------------------------------------
// Host side.

template <typename T, int R>
cudaError_t EnqueueForwardR(const T* features_t, int64_t ld,
                            const int32_t* indices, const T* weights,
                            T* scores, int64_t batch, int64_t num_features,
                            int64_t num_labels, int64_t fan_in, dim3 grid,
                            int64_t* error_scratch, cudaStream_t stream) {
  ForwardKernel<T, R><<<grid, kThreads, 0, stream>>>(
      features_t, ld, indices, weights, scores, batch, num_features,
      num_labels, fan_in, error_scratch);
  return cudaGetLastError();
}

template <typename T>
int Forward(const T* features, const int32_t* indices, const T* weights,
            T* scores, int64_t batch, int64_t num_features, int64_t num_labels,
            int64_t fan_in, void* workspace, int64_t* error_scratch,
            int64_t* bad_position, cudaStream_t stream) {
  *bad_position = -1;
  if (batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (num_labels == 0) return static_cast<int>(cudaSuccess);  // no indices
  if (fan_in == 0) {  // every score is an empty sum (all-zero bits)
    if (batch == 0) return static_cast<int>(cudaSuccess);
    return static_cast<int>(cudaMemsetAsync(
        scores, 0, static_cast<size_t>(batch * num_labels) * sizeof(T),
        stream));
  }
  int num_sms = 0;
  cudaError_t err = cuda::MultiprocessorCount(&num_sms);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t label_tiles = CeilDiv(num_labels, kLabels);
  if (label_tiles > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || num_features == 0) {
    // Nothing to compute (batch == 0), or every index is out of range
    // (num_features == 0) and the features must not be read: check only.
    return cuda::RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
      return EnqueueValidate(indices, num_labels * fan_in, num_features,
                             num_sms, error_scratch, stream);
    });
  }
  const Workspace ws = PlanWorkspace(0, sizeof(T), batch, num_features,
                                     num_labels, fan_in);
  T* features_t = Part<T>(workspace, ws.features_t);
  const int rows = RowsPerLane(batch);
  const int64_t instance_tiles = CeilDiv(batch, kWarpSize * rows);
  const dim3 grid(static_cast<unsigned>(label_tiles),
                  static_cast<unsigned>(
                      SplitTiles(label_tiles, instance_tiles, num_sms)));
  return cuda::RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
    cudaError_t e = EnqueueTranspose(features, batch, num_features,
                                     num_features, features_t, ws.ld, stream);
    if (e != cudaSuccess) return e;
    const auto go = [&](auto r_tag) {
      constexpr int kR = decltype(r_tag)::value;
      return EnqueueForwardR<T, kR>(features_t, ws.ld, indices, weights,
                                    scores, batch, num_features, num_labels,
                                    fan_in, grid, error_scratch, stream);
    };
    switch (rows) {
      case 1: return go(std::integral_constant<int, 1>());
      case 2: return go(std::integral_constant<int, 2>());
      case 4: return go(std::integral_constant<int, 4>());
      default: return go(std::integral_constant<int, 8>());
    }
  });
}

}  // namespace
}  // namespace uniform_sparse_cuda
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// Launchers (extern "C", declared in uniform_sparse_kernels.h).

using xmc_tf::uniform_sparse_cuda::Forward;

#define XMC_US_FORWARD_LAUNCHER(SUFFIX, CT, T)                                \
  extern "C" int XmcUniformSparseForwardGpu##SUFFIX(                          \
      const CT* features, const int32_t* indices, const CT* weights,          \
      CT* scores, int64_t batch, int64_t num_features, int64_t num_labels,    \
      int64_t fan_in, void* workspace, int64_t* error_scratch,                \
      int64_t* bad_position, void* stream) {                                  \
    return Forward<T>(reinterpret_cast<const T*>(features), indices,          \
                      reinterpret_cast<const T*>(weights),                    \
                      reinterpret_cast<T*>(scores), batch, num_features,      \
                      num_labels, fan_in, workspace, error_scratch,           \
                      bad_position, static_cast<cudaStream_t>(stream));       \
  }

XMC_US_FORWARD_LAUNCHER(F32, float, float)
XMC_US_FORWARD_LAUNCHER(F16, uint16_t, __half)
XMC_US_FORWARD_LAUNCHER(BF16, uint16_t, __nv_bfloat16)
#undef XMC_US_FORWARD_LAUNCHER
