// The reduction of per-chunk (per-thread, per-part) float32 buffers into
// one output, shared by the CPU gradient kernels that accumulate into
// private buffers and add them up at the end (uniform_sparse, sampled).
// TensorFlow-side only.
//
//   SumChunks(ctx, buffer, chunks, size, out);
//   // out[p] = sum_{c < chunks} buffer[c * size + p], p < size
//
// The sums are float32, in chunk order (starting from +0), converted to T
// once; the positions are sharded over the kernel's CPU threads.  `out` may
// be `buffer` itself (T = float): every position is read before it is
// written, and by one thread only.
#ifndef XMC_TF_OPS_COMMON_SUM_CHUNKS_H_
#define XMC_TF_OPS_COMMON_SUM_CHUNKS_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

template <typename T>
void SumChunks(::tensorflow::OpKernelContext* ctx, const float* buffer,
               int64_t chunks, int64_t size, T* out) {
  if (size <= 0) return;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, size,
                      chunks + 1, [&](int64_t start, int64_t limit) {
                        for (int64_t p = start; p < limit; ++p) {
                          float s = 0.0f;
                          for (int64_t c = 0; c < chunks; ++c) {
                            s += buffer[c * size + p];
                          }
                          out[p] = static_cast<T>(s);
                        }
                      });
}

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_SUM_CHUNKS_H_
