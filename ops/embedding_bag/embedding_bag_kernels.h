// Shared functor header of the embedding-bag op family.
//
// The sparse-input encoder (xmc_tf.layers.SparseEmbeddingBag) computes, for a
// batch of sparse rows given as COO entries e = (rows[e], positions[e],
// weights[e]) over the u distinct feature rows `table` [u, d] of the batch:
//
//   out[i, :]        = sum_{e: rows[e] = i}      weights[e] * table[positions[e], :]
//   grad_table[p, :] = sum_{e: positions[e] = p} weights[e] * backward[rows[e], :]
//
// Both are one bucket pass (counting sort of the entries by output row) and
// one axpy of d floats per entry into the output row that owns it, so no two
// threads write one row.
//
// Value types: float and double sum in T; half and bfloat16 sum in float
// (one rounding to T per output value).
//
// Framework-free (no TensorFlow includes).  The op kernels (one class per
// op, templated on the device: ops/common/device.h) check and allocate, then
// call functor::BagProduct<Device, T> (CpuDevice in embedding_bag_kernels.cc;
// no GPU kernels yet).
#ifndef XMC_TF_OPS_EMBEDDING_BAG_EMBEDDING_BAG_KERNELS_H_
#define XMC_TF_OPS_EMBEDDING_BAG_EMBEDDING_BAG_KERNELS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/common/device.h"

namespace xmc_tf {

// Counting sort of entries by key (keys in [0, num_keys), already checked):
// on return, the entries of key k are order[offsets[k] .. offsets[k + 1]),
// in their original order.
inline void BucketEntries(const int64_t* keys, int64_t n, int64_t num_keys,
                          std::vector<int64_t>* offsets,
                          std::vector<int64_t>* order) {
  offsets->assign(num_keys + 1, 0);
  for (int64_t e = 0; e < n; ++e) ++(*offsets)[keys[e] + 1];
  for (int64_t k = 0; k < num_keys; ++k) (*offsets)[k + 1] += (*offsets)[k];
  std::vector<int64_t> next(offsets->begin(), offsets->end() - 1);
  order->resize(n);
  for (int64_t e = 0; e < n; ++e) (*order)[next[keys[e]]++] = e;
}

// out_row[0:d] = sum over the entries order[begin:end] of
// scale[e] * source[other[e] * d : +d]  (accumulated in T, entry order).
template <typename T>
inline void AccumulateRow(const int64_t* order, int64_t begin, int64_t end,
                          const int64_t* other, const T* scale,
                          const T* __restrict__ source, int64_t d,
                          T* __restrict__ out_row) {
  std::fill(out_row, out_row + d, T(0));
  for (int64_t j = begin; j < end; ++j) {
    const int64_t e = order[j];
    const T w = scale[e];
    const T* src = source + other[e] * d;
    for (int64_t c = 0; c < d; ++c) out_row[c] += w * src[c];
  }
}

// The same for a narrow T (half, bfloat16) summed in a wider Acc (float):
// acc[0:d] (scratch) takes the sum in entry order, rounded once to T at the
// end.
template <typename T, typename Acc>
inline void AccumulateRowWide(const int64_t* order, int64_t begin, int64_t end,
                              const int64_t* other, const T* scale,
                              const T* __restrict__ source, int64_t d,
                              Acc* __restrict__ acc, T* __restrict__ out_row) {
  std::fill(acc, acc + d, Acc(0));
  for (int64_t j = begin; j < end; ++j) {
    const int64_t e = order[j];
    const Acc w = static_cast<Acc>(scale[e]);
    const T* src = source + other[e] * d;
    for (int64_t c = 0; c < d; ++c) acc[c] += w * static_cast<Acc>(src[c]);
  }
  for (int64_t c = 0; c < d; ++c) out_row[c] = static_cast<T>(acc[c]);
}

namespace functor {

// out [num_keys, d] (fully written): out[k, :] = sum over the entries e
// (of nnz) with keys[e] = k of scale[e] * source[other[e], :].  keys and
// other are range-checked by the caller.
template <typename Device, typename T>
struct BagProduct {
  void operator()(::tensorflow::OpKernelContext* ctx, const int64_t* keys,
                  const int64_t* other, const T* scale, int64_t nnz,
                  const T* source, int64_t num_keys, int64_t d, T* out) const;
};

}  // namespace functor
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_EMBEDDING_BAG_EMBEDDING_BAG_KERNELS_H_
