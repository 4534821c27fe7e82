// The CPU forward of the uniform-sparse product (Algorithm 1), ForwardCpu
// of uniform_sparse_cpu.h.  The vector loop (cpu_loops::ForwardLabels) is
// in uniform_sparse_cpu_loops.h, compiled for AVX-512, AVX2 + FMA and
// baseline x86-64 and picked at run time by CPU features.
//
// Features are first transposed to featT [num_features, bp] (float32, the
// batch padded with zeros to bp, a multiple of 16).  Labels are processed
// in tiles of kTile; every connection (j, k) adds weights[j, k] *
// featT[indices[j, k], :] to the label's accumulators, held in vector
// registers (four independent partial sums over k).  The tile's results
// are written to scores[:, j0:j0+kTile] row by row.
//
// The forward, which every training step runs first, range-checks every
// index before it reads any (the gradients check only the rows they read).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/validation.h"
#include "ops/uniform_sparse/uniform_sparse_cpu.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_common.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_loops.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace uniform_sparse_cpu {

namespace {

// Range check of every entry of indices against [0, num_features); fails
// the op with InvalidArgument naming the smallest bad position.
bool IndicesInRange(OpKernelContext* ctx, const int32_t* idx,
                    const UniformSparseDims& d) {
  const int64_t bad =
      FirstOutOfRange(ctx, idx, d.num_labels * d.fan_in, 0, d.num_features);
  if (bad < 0) return true;
  ctx->CtxFailure(OutOfRange("indices", TensorShape({d.num_labels, d.fan_in}),
                             bad, idx[bad], 0, d.num_features,
                             "num_features"));
  return false;
}

}  // namespace

template <typename T>
void ForwardCpu(OpKernelContext* ctx, const T* features, const int32_t* idx,
                const T* weights, const UniformSparseDims& d, T* out) {
  if (!IndicesInRange(ctx, idx, d)) return;
  if (d.batch == 0 || d.num_labels == 0) return;
  const int64_t bp = PaddedBatch(d.batch);
  Tensor featT_t;
  OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                         TensorShape({d.num_features, bp}),
                                         &featT_t));
  float* featT = featT_t.flat<float>().data();
  TransposeFeatures(ctx, features, d.batch, d.num_features, bp, featT);
  const Isa isa = CpuIsa();
  const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, num_tiles,
      2 * kTile * d.fan_in * bp, [&](int64_t start, int64_t limit) {
        std::vector<float> acc(kTile * bp);
        // 16-bit weights are widened a tile at a time (never the whole
        // [m, s] matrix: 1 GiB of float32 at m = 2.8M, s = 96).
        std::vector<float> w_tile;
        for (int64_t tile = start; tile < limit; ++tile) {
          const int64_t j0 = tile * kTile;
          const int64_t nt = std::min(kTile, d.num_labels - j0);
          const float* w =
              AsFloat(weights + j0 * d.fan_in, nt * d.fan_in, &w_tile);
          cpu_loops::ForwardLabels(isa, featT, bp, idx + j0 * d.fan_in, w,
                                   nt, d.fan_in, acc.data());
          for (int64_t i = 0; i < d.batch; ++i) {
            T* row = out + i * d.num_labels + j0;
            for (int64_t t = 0; t < nt; ++t) {
              row[t] = static_cast<T>(acc[t * bp + i]);
            }
          }
        }
      });
}

#define XMC_US_INSTANTIATE(T)                                               \
  template void ForwardCpu<T>(OpKernelContext*, const T*, const int32_t*,  \
                              const T*, const UniformSparseDims&, T*);
XMC_US_CPU_TYPES(XMC_US_INSTANTIATE)
#undef XMC_US_INSTANTIATE

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf
