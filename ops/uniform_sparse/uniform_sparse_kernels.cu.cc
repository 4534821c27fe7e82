// Framework-free CUDA launchers of the uniform-sparse op family (float32,
// float16 and bfloat16 values; float32 accumulation).
//
// Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces -- Learning with 500k Labels on a Single
// Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.  The contract (layout,
// workspace, error reporting) is in uniform_sparse_kernels.h; this file
// includes no TensorFlow header so that it builds with nvcc alone and can be
// tested through ctypes (tools/build_cuda_harness.py, tests/gpu/).
//
// Notation: b = batch, e = num_features, m = num_labels, s = fan_in.
// features [b, e], indices/weights [m, s] (row j = the s connections of label
// j), scores/backward [b, m], all row-major.  Offsets are int64 (b * m
// exceeds 2^31 for m = 3M, b = 1024).
//
// Design.  Every kernel gathers, for each connection (j, k), the values of
// one feature for many instances.  In the operands' own layout those values
// are b floats e apart (features[i, idx] for i = 0..b), so a warp's gather
// touches 32 sectors of 32 bytes for 128 useful bytes.  The launchers
// therefore first transpose features into a workspace `features_t` [e, ld]
// (ld = b rounded up to a multiple of 32), where the values of one feature
// for 32 consecutive instances are one aligned 128-byte line (64 bytes for
// 16-bit types).  The transposed copy costs 2 * b * e * sizeof(T) bytes of
// traffic and is reused by every one of the m * s connections.
//
// A block owns a tile of 32 consecutive labels and walks the instances in
// tiles of 32 * R (R = 1, 2, 4 or 8 rows per lane, from the batch size); its
// 8 warps take the tile's labels in turn, one label per warp at a time.  A
// warp loads 32 connections of its label with one coalesced read of indices
// and weights (each lane one connection, range-checked there), then walks
// them, broadcasting each (index, weight) with __shfl_sync; lane l handles
// instances l, l + 32, ..., so every gather is a coalesced line of
// features_t.  A block's scores and back-propagated signal are staged in
// shared memory as [32 * R instances][32 labels] (row stride 33: no bank
// conflicts) so that scores / backward are read and written as rows of 32
// consecutive labels (128-byte lines), never as strided columns.
//
// * Forward (Algorithm 1): scores[i, j] = sum_k features_t[idx_jk, i] *
//   w_jk, accumulated in float in registers, written through the shared tile.
// * Gradient w.r.t. features (Algorithm 2): grad_features_t[idx_jk, i] +=
//   backward[i, j] * w_jk by float atomicAdd into a zeroed float workspace
//   [e, ld] (the lanes of a warp add into one 128-byte line), then one
//   transposing, converting pass writes grad_features [b, e].
// * Gradient w.r.t. weights (Algorithm 3): grad_weights[j, k] = sum_i
//   backward[i, j] * features_t[idx_jk, i]: each lane accumulates its
//   instances' products for 32 connections in registers, then a transposing
//   butterfly reduction (31 shuffles for 32 sums) leaves the sum of
//   connection kc + l in lane l, stored with one coalesced write.
// * Zero signal (Sec. 3.3): per label and group of 32 instances a
//   __ballot_sync counts the non-zero backward[i, j].  A label with none in
//   the tile reads only its indices (for the range check).  A group with
//   more than kSparseGroupMax is dense: it takes the connection-by-
//   connection path above, where a lane whose own signal is zero reads and
//   adds nothing (per-lane predicates, no data-dependent branch, so the
//   loads of many connections are in flight together).  The non-zeros of
//   the other groups are taken one at a time with the lanes over the
//   connections (each lane its own index and weight: one instruction per
//   non-zero instead of one per connection).  A zero entry therefore
//   contributes exactly 0, even against an inf or NaN feature or weight, as
//   on the CPU.
// * Both gradients (XmcUniformSparseGradGpu*): the same kernel with both
//   parts enabled reads backward, indices and weights once, as long as the
//   transposed features and the features gradient fit in half of the L2
//   together; beyond that, two kernels (one per gradient) are faster.
//
// When the label tiles alone cannot fill the GPU (small m), the instance
// tiles are also split over gridDim.y; the weights gradient then adds its
// partial sums atomically into a zeroed float accumulator.  With more than
// one instance tile and a 16-bit T that accumulator is a float workspace
// [m, s], converted to T at the end (one rounding, as on the CPU).
//
// Index checks: every launcher range-checks all m * s indices (the contract
// of the header: bad_position is -1 iff every index is in range; stricter
// than the CPU gradients, which check the rows of the labels with signal,
// the only ones they read).  Each warp checks the indices of its label where
// it loads them (also when its signal is zero); an out-of-range entry is
// recorded with atomicMin of its flat position (cuda::RecordBad,
// cuda::RunWithChecks<1> of ops/common/cuda_launch.h) and replaced by
// (index 0, weight 0), never used as an address, so the reported position
// is the smallest bad one.
// Zero-size inputs launch no empty grid: see the launchers at the end.
//
// Files: this one holds the gradient kernels and launchers
// (XmcUniformSparseGrad*Gpu*); the forward ones are in
// uniform_sparse_cuda_forward.cu.cc; the constants and the device and host
// helpers both use in uniform_sparse_cuda_common.h (non-template host
// helpers, the index-check kernel and XmcUniformSparseGpuWorkspaceBytes in
// uniform_sparse_cuda_common.cu.cc).

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
// Gradients (Algorithms 2 and 3; see the file comment), one or both.
//
// Grid and block as ForwardKernel.  kFeatures: atomically add into
// grad_features_t [e, ld] (float, zeroed).  kWeights: the weights gradient,
// stored to grad_weights [m, s] (T) when `accumulate` is false (one instance
// tile and gridDim.y == 1), else atomically added to grad_weights_acc
// [m, s] (float, zeroed).

// Transposing butterfly: on entry lane l holds p[q] = its partial sum for
// connection q (q < 32); on return p[0] of lane l is the warp's sum for
// connection l.
__device__ __forceinline__ void ReduceTranspose32(float (&p)[kWarpSize],
                                                  int lane) {
#pragma unroll
  for (int half = kWarpSize / 2; half >= 1; half /= 2) {
    const bool upper = (lane & half) != 0;
#pragma unroll
    for (int q = 0; q < half; ++q) {
      const float send = upper ? p[q] : p[q + half];
      const float keep = upper ? p[q + half] : p[q];
      p[q] = keep + __shfl_xor_sync(kFullMask, send, half);
    }
  }
}

// The dense part of one chunk of connections: lane l's instances
// i0 + l + 32 r with gd[r] != 0 (groups with many non-zeros).  Connection q
// (q < n) of the chunk is (idx, w) of lane q.  kWeights: p[q] = this lane's
// sum over its instances of gd[r] * features_t[idx_q, i]; kFeatures: adds
// gd[r] * w_q to grad_features_t[idx_q, i].  No branch depends on the data
// (zero entries are per-lane predicates), so the compiler may issue the
// loads of many connections together.
template <typename T, int R, bool kFeatures, bool kWeights, bool kFull>
__device__ __forceinline__ void DenseChunk(
    const T* __restrict__ base, float* __restrict__ out_base, int64_t ld,
    int32_t idx, float w, const float (&gd)[R], int n, float (&p)[kWarpSize]) {
  if (kWeights) {
#pragma unroll
    for (int q = 0; q < kWarpSize; ++q) {
      p[q] = 0.0f;
      if (kFull || q < n) {  // uniform
        const int64_t offset =
            static_cast<int64_t>(__shfl_sync(kFullMask, idx, q)) * ld;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          // gd[r] == 0 past the batch and for a zero signal: no read (a
          // zero signal contributes exactly 0, even against inf / NaN).
          float v = 0.0f;
          if (gd[r] != 0.0f) v = Load(base + offset + kWarpSize * r);
          p[q] = fmaf(gd[r], v, p[q]);
        }
      }
    }
  }
  if (kFeatures) {
#pragma unroll
    for (int q = 0; q < kWarpSize; ++q) {
      if (kFull || q < n) {  // uniform
        const int64_t offset =
            static_cast<int64_t>(__shfl_sync(kFullMask, idx, q)) * ld;
        const float wq = __shfl_sync(kFullMask, w, q);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (gd[r] != 0.0f) {
            atomicAdd(out_base + offset + kWarpSize * r, gd[r] * wq);
          }
        }
      }
    }
  }
}

// At most this many non-zero instances in a group of 32 make the group
// sparse: its non-zeros are taken one at a time with the lanes over the
// connections (one instruction per non-zero instead of one per connection).
constexpr int kSparseGroupMax = 4;

template <typename T, int R, bool kFeatures, bool kWeights>
__global__ void __launch_bounds__(kThreads)
    GradKernel(const T* __restrict__ backward, const T* __restrict__ features_t,
               int64_t ld, const int32_t* __restrict__ indices,
               const T* __restrict__ weights,
               float* __restrict__ grad_features_t, T* __restrict__ grad_weights,
               float* __restrict__ grad_weights_acc, bool accumulate,
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
    // Stage backward[i0 .., label_begin ..] as rows of 32 labels.
    {
      const int64_t j = label_begin + lane;
      for (int r = warp; r < kTileRows; r += kWarps) {
        tile[r][lane] = (r < rows_here && j < num_labels)
                            ? Load(backward + (i0 + r) * num_labels + j)
                            : 0.0f;
      }
    }
    __syncthreads();
    for (int jj = warp; jj < kLabels; jj += kWarps) {
      const int64_t j = label_begin + jj;
      if (j >= num_labels) continue;  // uniform within the warp
      // Lane l's signal for instances i0 + l + 32 r, split into dense
      // groups (gd) and the non-zero lanes of sparse groups (sparse[r]).
      float g[R], gd[R];
      unsigned sparse[R];
      bool any = false, any_dense = false;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        g[r] = tile[lane + kWarpSize * r][jj];
        const unsigned nz = __ballot_sync(kFullMask, g[r] != 0.0f);
        const bool dense = __popc(nz) > kSparseGroupMax;
        gd[r] = dense ? g[r] : 0.0f;
        sparse[r] = dense ? 0u : nz;
        any = any || nz != 0u;
        any_dense = any_dense || dense;
      }
      const int64_t row = j * fan_in;
      const T* base = kWeights ? features_t + i0 + lane : nullptr;
      float* out_base = kFeatures ? grad_features_t + i0 + lane : nullptr;
      for (int64_t kc = 0; kc < fan_in; kc += kWarpSize) {
        int32_t idx;
        float w;
        // Indices are loaded (and checked) even without signal; weights only
        // for the features gradient of a label with signal.
        if (kFeatures && any) {
          LoadConnections<T, true>(indices, weights, row, kc, fan_in,
                                   num_features, lane, &idx, &w,
                                   error_scratch);
        } else {
          LoadConnections<T, false>(indices, weights, row, kc, fan_in,
                                    num_features, lane, &idx, &w,
                                    error_scratch);
        }
        const int64_t k = kc + lane;
        if (!any) {
          if (kWeights && !accumulate && k < fan_in) {
            grad_weights[row + k] = FromFloat<T>(0.0f);
          }
          continue;
        }
        float own = 0.0f;  // kWeights: the sum for connection k
        if (any_dense) {
          const int n = static_cast<int>(Min64(kWarpSize, fan_in - kc));
          float p[kWarpSize];
          if (n == kWarpSize) {
            DenseChunk<T, R, kFeatures, kWeights, true>(base, out_base, ld,
                                                        idx, w, gd, n, p);
          } else {
            DenseChunk<T, R, kFeatures, kWeights, false>(base, out_base, ld,
                                                         idx, w, gd, n, p);
          }
          if (kWeights) {
            ReduceTranspose32(p, lane);
            own = p[0];
          }
        }
        // Sparse groups: one non-zero instance at a time, lane l on
        // connection kc + l (its own idx, w: no shuffle).
        const int64_t line = static_cast<int64_t>(idx) * ld + i0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          unsigned mask = sparse[r];
          while (mask != 0u) {  // uniform
            const int l = __ffs(mask) - 1;
            mask &= mask - 1u;
            const float gi = __shfl_sync(kFullMask, g[r], l);
            if (k < fan_in) {
              const int64_t at = line + kWarpSize * r + l;
              if (kWeights) own = fmaf(gi, Load(features_t + at), own);
              if (kFeatures) atomicAdd(grad_features_t + at, gi * w);
            }
          }
        }
        if (kWeights && k < fan_in) {
          if (accumulate) {
            atomicAdd(grad_weights_acc + row + k, own);
          } else {
            grad_weights[row + k] = FromFloat<T>(own);
          }
        }
      }
    }
    __syncthreads();  // the tile is rewritten by the next instance tile
  }
}

// ---------------------------------------------------------------------------
// Host side (the helpers shared with the forward are in
// uniform_sparse_cuda_common.h).

// *bytes = the L2 cache size of the current device.
cudaError_t L2CacheBytes(int* bytes) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(bytes, cudaDevAttrL2CacheSize, device);
}

template <typename T, int R, bool kFeatures, bool kWeights>
cudaError_t EnqueueGradR(const T* backward, const T* features_t, int64_t ld,
                         const int32_t* indices, const T* weights,
                         float* grad_features_t, T* grad_weights,
                         float* grad_weights_acc, bool accumulate,
                         int64_t batch, int64_t num_features,
                         int64_t num_labels, int64_t fan_in, dim3 grid,
                         int64_t* error_scratch, cudaStream_t stream) {
  GradKernel<T, R, kFeatures, kWeights><<<grid, kThreads, 0, stream>>>(
      backward, features_t, ld, indices, weights, grad_features_t,
      grad_weights, grad_weights_acc, accumulate, batch, num_features,
      num_labels, fan_in, error_scratch);
  return cudaGetLastError();
}

// Both gradients or one (grad_features / grad_weights may be null; then
// features / weights may be too).
template <typename T>
int Gradients(const T* backward, const T* features, const int32_t* indices,
              const T* weights, T* grad_features, T* grad_weights,
              int64_t batch, int64_t num_features, int64_t num_labels,
              int64_t fan_in, void* workspace, int64_t* error_scratch,
              int64_t* bad_position, cudaStream_t stream) {
  *bad_position = -1;
  if (batch < 0 || num_features < 0 || num_labels < 0 || fan_in < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const bool want_features = grad_features != nullptr;
  const bool want_weights = grad_weights != nullptr;
  const int kind = want_features ? (want_weights ? 3 : 1) : 2;
  const int64_t total = num_labels * fan_in;
  if (want_features && batch > 0 && num_features > 0 && total == 0) {
    return static_cast<int>(cudaMemsetAsync(
        grad_features, 0,
        static_cast<size_t>(batch * num_features) * sizeof(T), stream));
  }
  if (total == 0) return static_cast<int>(cudaSuccess);
  int num_sms = 0;
  cudaError_t err = cuda::MultiprocessorCount(&num_sms);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t label_tiles = CeilDiv(num_labels, kLabels);
  if (label_tiles > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || num_features == 0) {
    // No signal (batch == 0) or no feature (every index is out of range):
    // check the indices; the weights gradient is all zero, the features
    // gradient has no entry or is all zero.
    return cuda::RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
      if (want_weights) {
        const cudaError_t e = cudaMemsetAsync(
            grad_weights, 0, static_cast<size_t>(total) * sizeof(T), stream);
        if (e != cudaSuccess) return e;
      }
      return EnqueueValidate(indices, total, num_features, num_sms,
                             error_scratch, stream);
    });
  }
  const Workspace ws = PlanWorkspace(kind, sizeof(T), batch, num_features,
                                     num_labels, fan_in);
  T* features_t =
      ws.features_t >= 0 ? Part<T>(workspace, ws.features_t) : nullptr;
  float* grad_features_t = ws.grad_features_t >= 0
                               ? Part<float>(workspace, ws.grad_features_t)
                               : nullptr;
  const int rows = RowsPerLane(batch);
  const int64_t instance_tiles = CeilDiv(batch, kWarpSize * rows);
  const int64_t splits = SplitTiles(label_tiles, instance_tiles, num_sms);
  const dim3 grid(static_cast<unsigned>(label_tiles),
                  static_cast<unsigned>(splits));
  // Both gradients in one kernel only while the transposed features and
  // the features gradient fit in half of the L2 cache together: the one
  // kernel gathers from the first and adds into the second at random rows,
  // and beyond the L2 both would go to DRAM (then two kernels, each with
  // its own operand in the L2, are faster).
  bool fused = false;
  if (kind == 3) {
    int l2_bytes = 0;
    err = L2CacheBytes(&l2_bytes);
    if (err != cudaSuccess) return static_cast<int>(err);
    fused = num_features * ws.ld * (4 + static_cast<int64_t>(sizeof(T))) <=
            static_cast<int64_t>(l2_bytes) / 2;
  }
  // One instance tile in one block per label tile: the weights gradient is
  // stored; otherwise accumulated atomically in float.
  const bool accumulate = want_weights && (instance_tiles > 1 || splits > 1);
  float* grad_weights_acc = nullptr;
  if (accumulate) {
    grad_weights_acc = ws.grad_weights_acc >= 0
                           ? Part<float>(workspace, ws.grad_weights_acc)
                           : reinterpret_cast<float*>(grad_weights);
  }
  return cuda::RunWithChecks<1>(error_scratch, bad_position, stream, [&] {
    cudaError_t e = cudaSuccess;
    if (want_weights) {
      e = EnqueueTranspose(features, batch, num_features, num_features,
                           features_t, ws.ld, stream);
      if (e != cudaSuccess) return e;
    }
    if (want_features) {
      e = cudaMemsetAsync(grad_features_t, 0,
                          static_cast<size_t>(num_features * ws.ld) * 4,
                          stream);
      if (e != cudaSuccess) return e;
    }
    if (accumulate) {
      e = cudaMemsetAsync(grad_weights_acc, 0,
                          static_cast<size_t>(total) * 4, stream);
      if (e != cudaSuccess) return e;
    }
    const auto go = [&](auto r_tag, auto f_tag, auto w_tag) {
      constexpr int kR = decltype(r_tag)::value;
      constexpr bool kF = decltype(f_tag)::value;
      constexpr bool kW = decltype(w_tag)::value;
      return EnqueueGradR<T, kR, kF, kW>(
          backward, features_t, ws.ld, indices, weights, grad_features_t,
          grad_weights, grad_weights_acc, accumulate, batch, num_features,
          num_labels, fan_in, grid, error_scratch, stream);
    };
    const auto with_parts = [&](auto r_tag) {
      if (kind == 1) {
        return go(r_tag, std::true_type(), std::false_type());
      }
      if (kind == 2) {
        return go(r_tag, std::false_type(), std::true_type());
      }
      if (fused) return go(r_tag, std::true_type(), std::true_type());
      const cudaError_t first = go(r_tag, std::true_type(), std::false_type());
      if (first != cudaSuccess) return first;
      return go(r_tag, std::false_type(), std::true_type());
    };
    switch (rows) {
      case 1: e = with_parts(std::integral_constant<int, 1>()); break;
      case 2: e = with_parts(std::integral_constant<int, 2>()); break;
      case 4: e = with_parts(std::integral_constant<int, 4>()); break;
      default: e = with_parts(std::integral_constant<int, 8>()); break;
    }
    if (e != cudaSuccess) return e;
    if (want_features) {
      e = EnqueueTranspose(grad_features_t, num_features, batch, ws.ld,
                           grad_features, num_features, stream);
      if (e != cudaSuccess) return e;
    }
    if (accumulate && ws.grad_weights_acc >= 0) {
      e = EnqueueConvert(grad_weights_acc, total, grad_weights, num_sms,
                         stream);
    }
    return e;
  });
}

}  // namespace
}  // namespace uniform_sparse_cuda
}  // namespace xmc_tf

// ---------------------------------------------------------------------------
// Launchers (extern "C", declared in uniform_sparse_kernels.h).

using xmc_tf::uniform_sparse_cuda::Gradients;

#define XMC_US_LAUNCHERS(SUFFIX, CT, T)                                       \
  extern "C" int XmcUniformSparseGradFeaturesGpu##SUFFIX(                     \
      const CT* backward, const int32_t* indices, const CT* weights,          \
      CT* grad_features, int64_t batch, int64_t num_features,                 \
      int64_t num_labels, int64_t fan_in, void* workspace,                    \
      int64_t* error_scratch, int64_t* bad_position, void* stream) {          \
    return Gradients<T>(reinterpret_cast<const T*>(backward), nullptr,        \
                        indices, reinterpret_cast<const T*>(weights),         \
                        reinterpret_cast<T*>(grad_features), nullptr, batch,  \
                        num_features, num_labels, fan_in, workspace,          \
                        error_scratch, bad_position,                          \
                        static_cast<cudaStream_t>(stream));                   \
  }                                                                           \
  extern "C" int XmcUniformSparseGradWeightsGpu##SUFFIX(                      \
      const CT* backward, const CT* features, const int32_t* indices,         \
      CT* grad_weights, int64_t batch, int64_t num_features,                  \
      int64_t num_labels, int64_t fan_in, void* workspace,                    \
      int64_t* error_scratch, int64_t* bad_position, void* stream) {          \
    return Gradients<T>(reinterpret_cast<const T*>(backward),                 \
                        reinterpret_cast<const T*>(features), indices,        \
                        nullptr, nullptr, reinterpret_cast<T*>(grad_weights), \
                        batch, num_features, num_labels, fan_in, workspace,   \
                        error_scratch, bad_position,                          \
                        static_cast<cudaStream_t>(stream));                   \
  }                                                                           \
  extern "C" int XmcUniformSparseGradGpu##SUFFIX(                             \
      const CT* backward, const CT* features, const int32_t* indices,         \
      const CT* weights, CT* grad_features, CT* grad_weights, int64_t batch,  \
      int64_t num_features, int64_t num_labels, int64_t fan_in,               \
      void* workspace, int64_t* error_scratch, int64_t* bad_position,         \
      void* stream) {                                                         \
    return Gradients<T>(reinterpret_cast<const T*>(backward),                 \
                        reinterpret_cast<const T*>(features), indices,        \
                        reinterpret_cast<const T*>(weights),                  \
                        reinterpret_cast<T*>(grad_features),                  \
                        reinterpret_cast<T*>(grad_weights), batch,            \
                        num_features, num_labels, fan_in, workspace,          \
                        error_scratch, bad_position,                          \
                        static_cast<cudaStream_t>(stream));                   \
  }

XMC_US_LAUNCHERS(F32, float, float)
XMC_US_LAUNCHERS(F16, uint16_t, __half)
XMC_US_LAUNCHERS(BF16, uint16_t, __nv_bfloat16)
#undef XMC_US_LAUNCHERS
