// The features gradient by instance rows (GradFeaturesByRows of
// uniform_sparse_grad_plan.h): the path of grad_features when the signal
// has less than one non-zero per label column on average, or when the
// per-part buffers of the other paths would exceed kMaxScatterBytes.  Each
// work unit owns its output row; zero runs of the row are skipped 16
// (kTile) at a time, and a label's row of indices is range-checked where a
// non-zero signal first reads it.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/common/bad_index.h"
#include "ops/common/sum_chunks.h"
#include "ops/uniform_sparse/uniform_sparse_cpu.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_common.h"
#include "ops/uniform_sparse/uniform_sparse_grad_plan.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace uniform_sparse_cpu {

namespace {

// out[f] += g * w[j, k] at f = idx[j, k] for the labels j in [j0, j1) whose
// backward value g = back[j] is non-zero (out has num_features entries).
// Each such label's indices are range-checked before they are used; returns
// the position j * fan_in + k of the first bad one (the labels in order; out
// is then partly updated), or -1.
template <typename T>
int64_t GradFeaturesRow(const T* back, const int32_t* idx, const T* w,
                        int64_t j0, int64_t j1, int64_t fan_in,
                        int64_t num_features, float* out) {
  for (int64_t b0 = j0; b0 < j1; b0 += kTile) {
    const int64_t b1 = std::min(j1, b0 + kTile);
    if (AllZero(back + b0, b1 - b0)) continue;  // nothing is read
    for (int64_t j = b0; j < b1; ++j) {
      const float g = static_cast<float>(back[j]);
      if (g == 0.0f) continue;  // implicit negative mining: nothing is read
      const int32_t* ij = idx + j * fan_in;
      const int64_t bad = FirstOutOfRangeSerial(ij, fan_in, 0, num_features);
      if (bad >= 0) return j * fan_in + bad;
      const T* wj = w + j * fan_in;
      for (int64_t k = 0; k < fan_in; ++k) {
        out[ij[k]] += g * static_cast<float>(wj[k]);
      }
    }
  }
  return -1;
}

}  // namespace

// The features gradient by instance rows (a signal with less than one
// non-zero per label column on average, or per-thread buffers that would be
// too large): work units are (instance i, chunk of labels); each owns its
// output row (or a private buffer row when there is more than one chunk),
// and a zero backward[i, j] skips label j without reading it.
template <typename T>
void GradFeaturesByRows(OpKernelContext* ctx, const T* back,
                        const int32_t* idx, const T* w,
                        const UniformSparseDims& d, T* out) {
  const int64_t out_size = d.batch * d.num_features;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t threads = std::max(1, workers->num_threads);
  // Split labels into chunks when the batch alone cannot keep every thread
  // busy.
  int64_t chunks = 1;
  if (d.batch < 2 * threads && d.num_labels >= 4096) {
    chunks = std::min<int64_t>((2 * threads + d.batch - 1) / d.batch,
                               d.num_labels / 2048);
  }
  const bool direct = chunks == 1 && std::is_same<T, float>::value;
  Tensor buffer_t;
  float* buffer = nullptr;
  if (direct) {
    buffer = reinterpret_cast<float*>(out);
  } else {
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({chunks, d.batch, d.num_features}),
                            &buffer_t));
    buffer = buffer_t.flat<float>().data();
  }
  const int64_t per_chunk = (d.num_labels + chunks - 1) / chunks;
  FirstBad bad;
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, d.batch * chunks,
      per_chunk * 4 + d.num_features, [&](int64_t start, int64_t limit) {
        for (int64_t u = start; u < limit; ++u) {
          const int64_t c = u / d.batch, i = u % d.batch;
          float* row = buffer + (c * d.batch + i) * d.num_features;
          std::fill(row, row + d.num_features, 0.0f);
          const int64_t p = GradFeaturesRow<T>(
              back + i * d.num_labels, idx, w, c * per_chunk,
              std::min(d.num_labels, (c + 1) * per_chunk), d.fan_in,
              d.num_features, row);
          if (p >= 0) bad.Record(p);
        }
      });
  if (bad.found()) return FailIndex(ctx, idx, d, bad.get());
  if (!direct) SumChunks(ctx, buffer, chunks, out_size, out);
}

#define XMC_US_INSTANTIATE(T)                                             \
  template void GradFeaturesByRows<T>(OpKernelContext*, const T*,        \
                                      const int32_t*, const T*,          \
                                      const UniformSparseDims&, T*);
XMC_US_CPU_TYPES(XMC_US_INSTANTIATE)
#undef XMC_US_INSTANTIATE

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf
