// The non-template host helpers of the uniform-sparse CUDA launchers
// (declared in uniform_sparse_cuda_common.h), the index-check kernel and
// XmcUniformSparseGpuWorkspaceBytes (uniform_sparse_kernels.h).  Framework-
// free: builds with nvcc alone.

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/cuda_launch.h"
#include "ops/uniform_sparse/uniform_sparse_cuda_common.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"

namespace xmc_tf {
namespace uniform_sparse_cuda {
namespace {

// Range check of every entry of indices [total] (grid-stride).
__global__ void __launch_bounds__(kThreads)
    ValidateIndicesKernel(const int32_t* __restrict__ indices, int64_t total,
                          int64_t num_features,
                          int64_t* __restrict__ error_scratch) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       p < total; p += stride) {
    if (!InRange(__ldg(indices + p), num_features)) RecordBad(error_scratch, p);
  }
}

// features_t row length: the batch rounded up to whole 128-byte lines.
int64_t LeadingDim(int64_t batch) { return AlignUp(Max64(batch, 1), kLd); }

}  // namespace

int RowsPerLane(int64_t batch) {
  int r = 1;
  while (r < kMaxRows && static_cast<int64_t>(r) * kWarpSize < batch) r *= 2;
  return r;
}

int64_t SplitTiles(int64_t label_tiles, int64_t instance_tiles, int num_sms) {
  const int64_t target = static_cast<int64_t>(num_sms) * kBlocksPerSmTarget;
  if (label_tiles >= target) return 1;
  return Max64(1, Min64(Min64(CeilDiv(target, label_tiles), instance_tiles),
                        kMaxGridY));
}

cudaError_t EnqueueValidate(const int32_t* indices, int64_t total,
                            int64_t num_features, int num_sms,
                            int64_t* error_scratch, cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  const unsigned blocks =
      cuda::Grid1d(CeilDiv(total, kThreads),
                   static_cast<int64_t>(num_sms) * kBlocksPerSmTarget * 4);
  ValidateIndicesKernel<<<blocks, kThreads, 0, stream>>>(
      indices, total, num_features, error_scratch);
  return cudaGetLastError();
}

Workspace PlanWorkspace(int kind, int value_bytes, int64_t batch,
                        int64_t num_features, int64_t num_labels,
                        int64_t fan_in) {
  Workspace w;
  w.ld = LeadingDim(batch);
  const int64_t lines = num_features * w.ld;
  const bool features = kind == 1 || kind == 3;
  const bool weights = kind == 2 || kind == 3;
  if (kind != 1) {
    w.features_t = w.bytes;
    w.bytes += AlignUp(lines * value_bytes, kAlign);
  }
  if (features) {
    w.grad_features_t = w.bytes;
    w.bytes += AlignUp(lines * 4, kAlign);
  }
  // A float accumulator for 16-bit weights gradients; float ones accumulate
  // in grad_weights itself.
  if (weights && value_bytes != 4) {
    w.grad_weights_acc = w.bytes;
    w.bytes += AlignUp(num_labels * fan_in * 4, kAlign);
  }
  return w;
}

}  // namespace uniform_sparse_cuda
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// Launcher (extern "C", declared in uniform_sparse_kernels.h).

using xmc_tf::uniform_sparse_cuda::PlanWorkspace;

extern "C" int64_t XmcUniformSparseGpuWorkspaceBytes(
    int kind, int value_bytes, int64_t batch, int64_t num_features,
    int64_t num_labels, int64_t fan_in) {
  if (kind < 0 || kind > 3 || (value_bytes != 2 && value_bytes != 4) ||
      batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0) {
    return -1;
  }
  return PlanWorkspace(kind, value_bytes, batch, num_features, num_labels,
                       fan_in)
      .bytes;
}
