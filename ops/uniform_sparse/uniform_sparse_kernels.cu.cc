// Framework-free CUDA launchers of the uniform-sparse op family (float32).
//
// Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces -- Learning with 500k Labels on a Single
// Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.  The contract (layout, error
// reporting) is in uniform_sparse_kernels.h; this file includes no TensorFlow
// header so that it builds with nvcc alone and can be tested through ctypes
// (tools/build_cuda_harness.py, tests/gpu/).
//
// Notation: b = batch, e = num_features, m = num_labels, s = fan_in.
// features [b, e], indices/weights [m, s] (row j = the s connections of label
// j), scores/backward [b, m], all row-major.  Offsets are int64 (b * m
// exceeds 2^31 for m = 3M, b = 1024).
//
// Kernel designs (written without a GPU to measure on; the reasoning is the
// memory-access pattern, which dominates: every kernel is memory-bound):
//
// * Forward (Algorithm 1, tiled).  A block owns a tile of 32 labels (one per
//   lane) and a range of instances; its 1-8 warps split the instances.  The
//   tile's indices and weights (32 x s, contiguous in memory) are loaded once
//   with coalesced reads, range-checked, and stored transposed in shared
//   memory ([k][lane], row stride 33 so neither the transposing store nor the
//   per-k read has bank conflicts).  Each thread then computes the scores of
//   its label for kFwdRows = 4 instances at a time: per connection k one
//   shared-memory read of (index, weight) is reused for 4 independent
//   feature gathers (memory-level parallelism), accumulating in float.  A
//   warp writes scores[i, j0:j0+32], one coalesced 128-byte store.
//   With the whole batch in one block (the default for large m) indices and
//   weights are read from DRAM exactly once instead of b times (Algorithm 1
//   literally re-reads them for every instance).  Because all blocks walk the
//   instances in the same order, the feature rows being gathered at any time
//   are the same few rows across the GPU and stay in L2.
//   Features are deliberately NOT staged in shared memory: the gathers are
//   random over e, so a block would have to stage whole rows (e * 4 bytes,
//   128 KiB at e = 32768, beyond the 48 KiB default and Turing's 64 KiB) to
//   serve only 32 * s gathers per row; L1/L2 serve those gathers at sector
//   granularity for less traffic.  For s > 64 the connections are staged in
//   chunks of 64 and re-staged per group of instances (L1/L2 hits).
//   Small batches use fewer warps per block so that no warp idles.
//
// * Gradient w.r.t. features (Algorithm 2).  Lanes map to 32 consecutive
//   labels of one instance, so backward[i, j0:j0+32] is one coalesced load;
//   a __ballot_sync of "signal != 0" lets a warp whose 32 signals are all zero
//   skip the (i, tile) pair without touching indices or weights (the warp-level
//   skip of Sec. 3.3, footnote 3); each warp issues the loads of 4 instances
//   together so that skipping is bandwidth-, not latency-bound.  The
//   non-zero labels of the warp are then compacted (rank within the ballot
//   -> per-warp shared slot) and processed by groups of
//   G = min(32, next_pow2(s)) lanes, one label per group, lanes
//   striding over k: for s >= 32 a whole warp reads a label's indices/weights
//   with coalesced loads and issues 32 independent atomicAdds, and no lane
//   idles because a neighbouring label had zero signal (the naive
//   one-thread-per-(i, j) loop of Algorithm 2 would leave 31 of 32 lanes idle
//   at 3 % density).  For s = 1, G = 1 and this is exactly Algorithm 2.
//   grad_features is zeroed with cudaMemsetAsync first; updates are
//   atomicAdd (fire-and-forget RED instructions, result unused).  The 8 warps
//   of a block take different instances of the same label tile, so the
//   tile's indices/weights are re-read from L1, not DRAM.
//
// * Gradient w.r.t. weights (Algorithm 3).  One thread per structural
//   non-zero (j, k), consecutive threads = consecutive flat positions j*s+k,
//   so reading indices and writing grad_weights are coalesced and the threads
//   of one label (a whole warp for s >= 32) read the same backward[i, j]
//   (broadcast, uniform branch).  The instance loop is unrolled by 8: eight
//   backward loads are issued together, then the feature gathers of the
//   non-zero ones only (the features load is skipped when backward[i, j] is
//   0).  When m * s is too small to fill the GPU, the instance range is split
//   over gridDim.y and partial sums are atomically added into a zeroed
//   grad_weights.
//
// Index checks: every launcher range-checks all m * s indices (the contract of
// the header: bad_position is -1 iff every index is in range, like the CPU
// kernels).  Forward and grad-weights check each index where they load it;
// grad-features checks the tile's indices once in the blocks with
// blockIdx.y == 0 (one coalesced pass over indices, m * s * 4 bytes) and also
// re-checks every index it dereferences.  An out-of-range entry is recorded
// with atomicMin of its flat position into error_scratch (cuda::RecordBad
// and cuda::RunWithChecks<1> of ops/common/cuda_launch.h, which initialises
// the slot, copies it back and synchronises) and is never used as an
// address, so the reported position is the smallest bad one, as on the CPU.
// Zero-size inputs launch no empty grid: see the launchers at the end of the
// file.

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ops/common/cuda_launch.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"

namespace xmc_tf {
namespace uniform_sparse_cuda {
namespace {

using cuda::CeilDiv;
using cuda::kFullMask;
using cuda::kWarpSize;
using cuda::RecordBad;

constexpr int kMaxWarps = 8;                       // warps per block (max)
constexpr int kMaxThreads = kMaxWarps * kWarpSize;  // 256

// Forward.
constexpr int kFwdLabels = 32;               // labels per block (one per lane)
constexpr int kFwdStride = kFwdLabels + 1;   // padded shared-memory row
constexpr int kFwdMaxChunk = 64;             // connections staged per pass
constexpr int kFwdRows = 4;                  // instances per thread per pass

// Grad features.
constexpr int kGfLabels = kWarpSize;  // labels per block (one per lane)
constexpr int kGfUnroll = 4;           // instances per warp per step

// Grad weights.
constexpr int kGwThreads = 256;
constexpr int kGwUnroll = 8;  // backward loads in flight per thread

// Target number of resident blocks per SM when deciding whether to split the
// batch over gridDim.y (only matters when m is small).
constexpr int kBlocksPerSmTarget = 8;
constexpr int64_t kMaxGridY = 65535;

__host__ __device__ inline int64_t Min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__host__ __device__ inline int64_t Max64(int64_t a, int64_t b) {
  return a < b ? b : a;
}

__device__ __forceinline__ bool InRange(int32_t idx, int64_t num_features) {
  return idx >= 0 && static_cast<int64_t>(idx) < num_features;
}

// Range check of every entry of indices [total] (grid-stride).
__global__ void __launch_bounds__(kMaxThreads)
    ValidateIndicesKernel(const int32_t* __restrict__ indices, int64_t total,
                          int64_t num_features,
                          int64_t* __restrict__ error_scratch) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       p < total; p += stride) {
    if (!InRange(__ldg(indices + p), num_features)) RecordBad(error_scratch, p);
  }
}

// ---------------------------------------------------------------------------
// Forward (Algorithm 1, tiled; see the file comment).
//
// Grid: x = label tiles of kFwdLabels, y = instance ranges of
// `instances_per_block` (a multiple of warps * kFwdRows).  Block: 32 * warps
// threads.  Dynamic shared memory: 2 * chunk * kFwdStride * 4 bytes.

// Stages connections [k0, k0 + kc) of the block's labels into shared memory,
// transposed: s_idx[kk * kFwdStride + jj].  Out-of-range indices are recorded
// and replaced by (index 0, weight 0); labels past num_labels get the same.
// The caller guarantees num_features > 0, so index 0 is a valid address.
__device__ __forceinline__ void StageForwardChunk(
    const int32_t* __restrict__ indices, const float* __restrict__ weights,
    int64_t label_begin, int labels_here, int64_t fan_in, int64_t k0, int kc,
    int64_t num_features, int32_t* s_idx, float* s_w,
    int64_t* __restrict__ error_scratch) {
  const int total = kFwdLabels * kc;
  for (int t = threadIdx.x; t < total; t += blockDim.x) {
    const int jj = t / kc;
    const int kk = t - jj * kc;
    int32_t idx = 0;
    float w = 0.0f;
    if (jj < labels_here) {
      const int64_t pos = (label_begin + jj) * fan_in + k0 + kk;
      const int32_t raw = __ldg(indices + pos);
      if (InRange(raw, num_features)) {
        idx = raw;
        w = __ldg(weights + pos);
      } else {
        RecordBad(error_scratch, pos);
      }
    }
    s_idx[kk * kFwdStride + jj] = idx;
    s_w[kk * kFwdStride + jj] = w;
  }
}

__global__ void __launch_bounds__(kMaxThreads)
    ForwardKernel(const float* __restrict__ features,
                  const int32_t* __restrict__ indices,
                  const float* __restrict__ weights, float* __restrict__ scores,
                  int64_t batch, int64_t num_features, int64_t num_labels,
                  int64_t fan_in, int chunk, int64_t instances_per_block,
                  int64_t* __restrict__ error_scratch) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* s_idx = reinterpret_cast<int32_t*>(smem_raw);
  float* s_w = reinterpret_cast<float*>(smem_raw) + chunk * kFwdStride;

  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t label_begin = static_cast<int64_t>(blockIdx.x) * kFwdLabels;
  const int labels_here =
      static_cast<int>(Min64(kFwdLabels, num_labels - label_begin));
  const int64_t j = label_begin + lane;
  const bool label_ok = lane < labels_here;
  const int64_t i_begin =
      static_cast<int64_t>(blockIdx.y) * instances_per_block;
  const int64_t i_end = Min64(batch, i_begin + instances_per_block);
  const bool single_chunk = fan_in <= chunk;

  if (single_chunk) {
    StageForwardChunk(indices, weights, label_begin, labels_here, fan_in, 0,
                      static_cast<int>(fan_in), num_features, s_idx, s_w,
                      error_scratch);
    __syncthreads();
  }

  // The loop bounds are uniform over the block (required by __syncthreads).
  for (int64_t pass = i_begin; pass < i_end; pass += warps * kFwdRows) {
    const int64_t my_first = pass + warp * kFwdRows;
    const bool warp_active = my_first < i_end;  // uniform within the warp
    // Rows [0, valid_rows) of this thread's kFwdRows instances exist.
    const int valid_rows =
        label_ok ? static_cast<int>(Max64(0, Min64(kFwdRows, i_end - my_first)))
                 : 0;
    const float* rows[kFwdRows];
    float acc[kFwdRows];
#pragma unroll
    for (int r = 0; r < kFwdRows; ++r) {
      rows[r] = features + (r < valid_rows ? (my_first + r) * num_features : 0);
      acc[r] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < fan_in; k0 += chunk) {
      const int kc = static_cast<int>(Min64(chunk, fan_in - k0));
      if (!single_chunk) {
        __syncthreads();  // previous chunk fully consumed
        StageForwardChunk(indices, weights, label_begin, labels_here, fan_in,
                          k0, kc, num_features, s_idx, s_w, error_scratch);
        __syncthreads();
      }
      if (warp_active) {
#pragma unroll 4
        for (int kk = 0; kk < kc; ++kk) {
          const int32_t idx = s_idx[kk * kFwdStride + lane];
          const float w = s_w[kk * kFwdStride + lane];
#pragma unroll
          for (int r = 0; r < kFwdRows; ++r) {
            if (r < valid_rows) acc[r] = fmaf(__ldg(rows[r] + idx), w, acc[r]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kFwdRows; ++r) {
      if (r < valid_rows) scores[(my_first + r) * num_labels + j] = acc[r];
    }
  }
}

// ---------------------------------------------------------------------------
// Gradient w.r.t. features (Algorithm 2 with warp-level skipping and
// compaction; see the file comment).
//
// Grid: x = label tiles of 32, y = instance ranges of `instances_per_block`.
// Block: 32 * warps threads; warp w takes instances i_begin + w, + warps, ...
// (kGfUnroll of them per step).
// `log2_group`: log2 of the lanes cooperating on one label.

__global__ void __launch_bounds__(kMaxThreads)
    GradFeaturesKernel(const float* __restrict__ backward,
                       const int32_t* __restrict__ indices,
                       const float* __restrict__ weights,
                       float* __restrict__ grad_features, int64_t batch,
                       int64_t num_features, int64_t num_labels,
                       int64_t fan_in, int log2_group,
                       int64_t instances_per_block,
                       int64_t* __restrict__ error_scratch) {
  __shared__ int s_lane[kMaxWarps][kWarpSize];
  __shared__ float s_val[kMaxWarps][kWarpSize];

  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t label_begin = static_cast<int64_t>(blockIdx.x) * kGfLabels;
  const int64_t labels_here =
      Min64(kGfLabels, num_labels - label_begin);
  const int64_t j = label_begin + lane;
  const bool label_ok = lane < labels_here;

  // Full index check of this label tile, once per tile (contract: every
  // index is checked even if its label never has a non-zero signal).
  if (blockIdx.y == 0) {
    const int64_t first = label_begin * fan_in;
    const int64_t count = labels_here * fan_in;
    for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
      if (!InRange(__ldg(indices + first + t), num_features)) {
        RecordBad(error_scratch, first + t);
      }
    }
  }

  const int group = 1 << log2_group;       // lanes per label
  const int groups = kWarpSize >> log2_group;  // labels per warp step
  const int my_group = lane >> log2_group;
  const int sub = lane & (group - 1);
  const unsigned lanes_below = (1u << lane) - 1u;
  const int64_t i_begin =
      static_cast<int64_t>(blockIdx.y) * instances_per_block;
  const int64_t i_end = Min64(batch, i_begin + instances_per_block);

  // kGfUnroll backward loads are issued together (memory-level parallelism
  // for the common case where most warps skip); then each is processed.
  for (int64_t i0 = i_begin + warp; i0 < i_end;
       i0 += static_cast<int64_t>(warps) * kGfUnroll) {
    float signal[kGfUnroll];
#pragma unroll
    for (int u = 0; u < kGfUnroll; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * warps;
      signal[u] = (label_ok && i < i_end)
                      ? __ldg(backward + i * num_labels + j) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kGfUnroll; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * warps;
      const float g = signal[u];
      const unsigned nonzero = __ballot_sync(kFullMask, g != 0.0f);
      if (nonzero == 0u) continue;  // whole warp skipped (uniform branch)
      if (g != 0.0f) {
        const int rank = __popc(nonzero & lanes_below);
        s_lane[warp][rank] = lane;
        s_val[warp][rank] = g;
      }
      __syncwarp();
      const int n = __popc(nonzero);
      float* grad_row = grad_features + i * num_features;
      for (int base = 0; base < n; base += groups) {
        const int t = base + my_group;
        if (t < n) {
          const int64_t row = (label_begin + s_lane[warp][t]) * fan_in;
          const float v = s_val[warp][t];
          for (int64_t k = sub; k < fan_in; k += group) {
            const int32_t idx = __ldg(indices + row + k);
            if (InRange(idx, num_features)) {
              atomicAdd(grad_row + idx, v * __ldg(weights + row + k));
            } else {
              RecordBad(error_scratch, row + k);
            }
          }
        }
      }
      __syncwarp();  // slots are read before the next instance rewrites them
    }
  }
}

// ---------------------------------------------------------------------------
// Gradient w.r.t. weights (Algorithm 3; see the file comment).
//
// Grid: x = ceil(m * s / 256) blocks of 256 threads, one thread per flat
// position p = j * s + k; y = instance ranges of `instances_per_block`.  With
// gridDim.y == 1 the thread stores its sum; otherwise (`accumulate`) it
// atomically adds its partial sum into grad_weights, zeroed by the launcher.

__global__ void __launch_bounds__(kGwThreads)
    GradWeightsKernel(const float* __restrict__ backward,
                      const float* __restrict__ features,
                      const int32_t* __restrict__ indices,
                      float* __restrict__ grad_weights, int64_t batch,
                      int64_t num_features, int64_t num_labels,
                      int64_t fan_in, int64_t instances_per_block,
                      bool accumulate, int64_t* __restrict__ error_scratch) {
  const int64_t p =
      static_cast<int64_t>(blockIdx.x) * kGwThreads + threadIdx.x;
  if (p >= num_labels * fan_in) return;
  const int64_t j = p / fan_in;
  const int32_t idx = __ldg(indices + p);
  if (!InRange(idx, num_features)) {
    RecordBad(error_scratch, p);
    if (!accumulate) grad_weights[p] = 0.0f;
    return;  // the bad index is never used as an address
  }
  const int64_t i_begin =
      static_cast<int64_t>(blockIdx.y) * instances_per_block;
  const int64_t i_end = Min64(batch, i_begin + instances_per_block);
  const float* back_col = backward + j;   // backward[i, j] = back_col[i * m]
  const float* feat_col = features + idx;  // features[i, idx] = feat_col[i * e]
  float acc = 0.0f;
  int64_t i = i_begin;
  for (; i + kGwUnroll <= i_end; i += kGwUnroll) {
    float g[kGwUnroll];
#pragma unroll
    for (int u = 0; u < kGwUnroll; ++u) {
      g[u] = __ldg(back_col + (i + u) * num_labels);
    }
#pragma unroll
    for (int u = 0; u < kGwUnroll; ++u) {
      if (g[u] != 0.0f) {
        acc = fmaf(g[u], __ldg(feat_col + (i + u) * num_features), acc);
      }
    }
  }
  for (; i < i_end; ++i) {
    const float g = __ldg(back_col + i * num_labels);
    if (g != 0.0f) acc = fmaf(g, __ldg(feat_col + i * num_features), acc);
  }
  if (accumulate) {
    atomicAdd(grad_weights + p, acc);
  } else {
    grad_weights[p] = acc;
  }
}

// ---------------------------------------------------------------------------
// Host helpers.

// Splits `batch` instances over gridDim.y so that about
// kBlocksPerSmTarget * num_sms blocks exist, each range at least `min_range`
// instances and a multiple of `multiple`.  Returns instances per block
// (>= 1) and sets *splits.
int64_t SplitInstances(int64_t batch, int64_t blocks_x, int num_sms,
                       int64_t min_range, int64_t multiple, int64_t* splits) {
  if (batch <= 0) {
    *splits = 1;
    return 1;
  }
  const int64_t target = static_cast<int64_t>(num_sms) * kBlocksPerSmTarget;
  int64_t want = blocks_x >= target ? 1 : CeilDiv(target, blocks_x);
  want = Min64(want, CeilDiv(batch, min_range));
  want = Max64(1, Min64(want, kMaxGridY));
  int64_t per_block = CeilDiv(CeilDiv(batch, want), multiple) * multiple;
  *splits = CeilDiv(batch, per_block);
  return per_block;
}

// Warps per block for kernels whose warps split `instances` instances
// `rows_per_warp` at a time: no more than needed, 1..kMaxWarps.
int WarpsFor(int64_t instances, int64_t rows_per_warp) {
  const int64_t w = CeilDiv(Max64(instances, 1), rows_per_warp);
  return static_cast<int>(Min64(w, kMaxWarps));
}

cudaError_t EnqueueValidate(const int32_t* indices, int64_t total,
                            int64_t num_features, int num_sms,
                            int64_t* error_scratch, cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  const unsigned blocks =
      cuda::Grid1d(CeilDiv(total, kMaxThreads),
                   static_cast<int64_t>(num_sms) * kBlocksPerSmTarget * 4);
  ValidateIndicesKernel<<<blocks, kMaxThreads, 0, stream>>>(
      indices, total, num_features, error_scratch);
  return cudaGetLastError();
}

}  // namespace
}  // namespace uniform_sparse_cuda
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// Launchers (extern "C", declared in uniform_sparse_kernels.h).

using namespace xmc_tf::uniform_sparse_cuda;  // NOLINT(build/namespaces)
using xmc_tf::cuda::MultiprocessorCount;
using xmc_tf::cuda::RunWithChecks;

extern "C" int XmcUniformSparseForwardGpuF32(
    const float* features, const int32_t* indices, const float* weights,
    float* scores, int64_t batch, int64_t num_features, int64_t num_labels,
    int64_t fan_in, int64_t* error_scratch, int64_t* bad_position,
    void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  *bad_position = -1;
  if (batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (num_labels == 0) return static_cast<int>(cudaSuccess);  // no indices
  if (fan_in == 0) {  // every score is an empty sum
    if (batch == 0) return static_cast<int>(cudaSuccess);
    return static_cast<int>(cudaMemsetAsync(
        scores, 0, static_cast<size_t>(batch * num_labels) * sizeof(float),
        stream));
  }
  int num_sms = 0;
  cudaError_t err = MultiprocessorCount(&num_sms);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t label_tiles = CeilDiv(num_labels, kFwdLabels);
  if (label_tiles > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);

  if (batch == 0 || num_features == 0) {
    // Nothing to compute (batch == 0), or every index is out of range
    // (num_features == 0) and the features must not be read: check only.
    return RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
      return EnqueueValidate(indices, num_labels * fan_in, num_features,
                             num_sms, error_scratch, stream);
    });
  }

  const int chunk =
      static_cast<int>(Min64(fan_in, kFwdMaxChunk));
  int64_t splits = 1;
  const int64_t per_block =
      SplitInstances(batch, label_tiles, num_sms, /*min_range=*/kFwdRows * 8,
                     /*multiple=*/kFwdRows, &splits);
  const int warps = WarpsFor(Min64(per_block, batch), kFwdRows);
  const size_t smem = 2 * static_cast<size_t>(chunk) * kFwdStride * 4;
  const dim3 grid(static_cast<unsigned>(label_tiles),
                  static_cast<unsigned>(splits));
  return RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
    ForwardKernel<<<grid, warps * kWarpSize, smem, stream>>>(
        features, indices, weights, scores, batch, num_features, num_labels,
        fan_in, chunk, per_block, error_scratch);
    return cudaGetLastError();
  });
}

extern "C" int XmcUniformSparseGradFeaturesGpuF32(
    const float* backward, const int32_t* indices, const float* weights,
    float* grad_features, int64_t batch, int64_t num_features,
    int64_t num_labels, int64_t fan_in, int64_t* error_scratch,
    int64_t* bad_position, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  *bad_position = -1;
  if (batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (batch > 0 && num_features > 0) {
    const cudaError_t err = cudaMemsetAsync(
        grad_features, 0,
        static_cast<size_t>(batch * num_features) * sizeof(float), stream);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (num_labels == 0 || fan_in == 0) return static_cast<int>(cudaSuccess);
  int num_sms = 0;
  cudaError_t err = MultiprocessorCount(&num_sms);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t label_tiles = CeilDiv(num_labels, kGfLabels);
  if (label_tiles > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);

  int log2_group = 0;
  while (log2_group < 5 && (int64_t{1} << log2_group) < fan_in) ++log2_group;
  int64_t splits = 1;
  const int64_t per_block =
      SplitInstances(batch, label_tiles, num_sms, /*min_range=*/kMaxWarps * 4,
                     /*multiple=*/kMaxWarps, &splits);
  const int warps = WarpsFor(Min64(per_block, batch), 1);
  const dim3 grid(static_cast<unsigned>(label_tiles),
                  static_cast<unsigned>(splits));
  // Runs even when batch == 0: the blockIdx.y == 0 blocks check the indices.
  // With num_features == 0 every index is out of range and none is used.
  return RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
    GradFeaturesKernel<<<grid, warps * kWarpSize, 0, stream>>>(
        backward, indices, weights, grad_features, batch, num_features,
        num_labels, fan_in, log2_group, per_block, error_scratch);
    return cudaGetLastError();
  });
}

extern "C" int XmcUniformSparseGradWeightsGpuF32(
    const float* backward, const float* features, const int32_t* indices,
    float* grad_weights, int64_t batch, int64_t num_features,
    int64_t num_labels, int64_t fan_in, int64_t* error_scratch,
    int64_t* bad_position, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  *bad_position = -1;
  if (batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t total = num_labels * fan_in;
  if (total == 0) return static_cast<int>(cudaSuccess);  // empty output
  int num_sms = 0;
  cudaError_t err = MultiprocessorCount(&num_sms);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t blocks_x = CeilDiv(total, kGwThreads);
  if (blocks_x > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);

  int64_t splits = 1;
  const int64_t per_block =
      SplitInstances(batch, blocks_x, num_sms, /*min_range=*/kGwUnroll * 8,
                     /*multiple=*/kGwUnroll, &splits);
  const bool accumulate = splits > 1;
  const dim3 grid(static_cast<unsigned>(blocks_x),
                  static_cast<unsigned>(splits));
  // With batch == 0 the kernel still runs: it checks every index and writes
  // zeros.
  return RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
    if (accumulate) {
      const cudaError_t e = cudaMemsetAsync(
          grad_weights, 0, static_cast<size_t>(total) * sizeof(float), stream);
      if (e != cudaSuccess) return e;
    }
    GradWeightsKernel<<<grid, kGwThreads, 0, stream>>>(
        backward, features, indices, grad_weights, batch, num_features,
        num_labels, fan_in, per_block, accumulate, error_scratch);
    return cudaGetLastError();
  });
}
