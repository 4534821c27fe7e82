// Partial-selection top-k of float32 score rows (Xmc>TopK): the functor
// declaration of the kernel and the framework-free selection functions it
// runs (topk_kernels.cc).
//
// Layout:
//   scores   [batch, m]   T (float32, float16, bfloat16), row-major; the
//                         selection below runs on float values (float16 and
//                         bfloat16 widened chunk by chunk: exact, same order)
//   values   [batch, k]   T: the k best scores of each row, best first
//   indices  [batch, k]   int32: their column ids
//
// Order (that of tf.math.top_k(sorted=True) on numbers): larger value first;
// equal values (-0.0 == +0.0) by the lower column id, also across the k-th
// position.  NaN ranks below every number (-inf included), NaNs among
// themselves by the lower id.  (tf.math.top_k has no consistent NaN order:
// its result on rows with NaN changes with k.)
//
// Algorithm (one pass over the scores, no sort of the row): a row, or a
// chunk of it, is scanned left to right while holding the best `k` entries
// seen so far in a small buffer.  `thr` is the worst held entry; an entry
// that is not strictly greater than `thr` cannot be in the top k (the k held
// entries are all >= it and, on equal values, have lower ids: the scan goes
// by increasing id), so the scan only compares each group of 16 scores with
// `thr` (vectorised) and copies the rare ones that pass into the buffer.  When
// the buffer holds `capacity` entries, std::nth_element keeps its best k and
// `thr` rises.  Amortised O(1) per score even on adversarial rows (an
// increasing row: every score passes, and each compaction of
// `capacity >= 2k` entries costs O(capacity)).  The chunks of a row are merged
// by the same selection over their candidates, then the k results are
// sorted.
//
// This header must not include TensorFlow.
#ifndef XMC_TF_OPS_TOPK_TOPK_KERNELS_H_
#define XMC_TF_OPS_TOPK_TOPK_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/common/device.h"

namespace xmc_tf {

namespace functor {

// values, indices [batch, k] (fully written) from scores [batch, m], with
// 0 <= k <= m < 2^31 (checked by the kernel): the selection below, rows
// spread over the device.
template <typename Device, typename T>
struct TopK {
  void operator()(::tensorflow::OpKernelContext* ctx, const T* scores,
                  int64_t batch, int64_t m, int64_t k, T* values,
                  int32_t* indices) const;
};

}  // namespace functor

namespace topk {

// Columns per unit of work (a (row, chunk) pair) at least; 256 KiB of scores.
constexpr int64_t kMinChunk = 1 << 16;
// Scores per vectorised threshold test.
constexpr int64_t kGroup = 64;
// Candidate buffer entries at least (it holds max(2 k, this)).
constexpr int64_t kMinCapacity = 16;

struct Entry {
  float value;
  int64_t index;
};

// Whether a ranks before b: larger value, then lower index; NaN last.
inline bool Better(const Entry& a, const Entry& b) {
  const bool a_nan = std::isnan(a.value), b_nan = std::isnan(b.value);
  if (a_nan || b_nan) {
    if (a_nan && b_nan) return a.index < b.index;
    return b_nan;
  }
  if (a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

struct BetterCmp {
  bool operator()(const Entry& a, const Entry& b) const { return Better(a, b); }
};

// Chunks per row: enough (row, chunk) units for 4 per thread, but no chunk
// shorter than max(kMinChunk, 8 k) columns (each chunk scans its first k
// scores unfiltered and warms its own threshold up: fewer, longer chunks
// filter better).  1 for m = 0.
inline int64_t ChunksPerRow(int64_t batch, int64_t m, int64_t k,
                            int64_t threads) {
  const int64_t min_chunk = std::max<int64_t>(kMinChunk, 8 * k);
  const int64_t most = std::max<int64_t>(1, m / min_chunk);
  const int64_t want = (4 * std::max<int64_t>(1, threads) + batch - 1) /
                       std::max<int64_t>(1, batch);
  return std::max<int64_t>(1, std::min(most, want));
}

#if defined(__GNUC__)
typedef float TopkVec4 __attribute__((vector_size(16)));
typedef int32_t TopkInt4 __attribute__((vector_size(16)));

// Whether any of the kGroup floats at p is > t (NaN compares false): four
// compares per 16 floats OR-ed into one mask, one horizontal test per group
// (GCC vector extensions: SSE on baseline x86-64, NEON on arm64).
inline bool AnyGreater(const float* p, float t) {
  const TopkVec4 tv = {t, t, t, t};
  TopkInt4 m = {0, 0, 0, 0};
  for (int q = 0; q < kGroup; q += 16) {
    TopkVec4 a, b, c, d;
    __builtin_memcpy(&a, p + q, 16);
    __builtin_memcpy(&b, p + q + 4, 16);
    __builtin_memcpy(&c, p + q + 8, 16);
    __builtin_memcpy(&d, p + q + 12, 16);
    m |= (a > tv) | (b > tv) | (c > tv) | (d > tv);
  }
  return (m[0] | m[1] | m[2] | m[3]) != 0;
}
#else
inline bool AnyGreater(const float* p, float t) {
  bool any = false;
  for (int q = 0; q < kGroup; ++q) any |= p[q] > t;
  return any;
}
#endif

// Keeps the best k entries of buf (k < buf->size()), in no order.
inline void KeepBest(std::vector<Entry>* buf, int64_t k) {
  std::nth_element(buf->begin(), buf->begin() + (k - 1), buf->end(),
                   BetterCmp());
  buf->resize(k);
}

// The worst of the entries of buf (non-empty).
inline Entry Worst(const std::vector<Entry>& buf) {
  Entry w = buf[0];
  for (const Entry& e : buf) {
    if (Better(w, e)) w = e;
  }
  return w;
}

// Appends to *out the best min(k, n) entries of the n scores x[0..n) (column
// ids base + 0 .. base + n - 1), in no order.  k >= 1.  `buf` is scratch.
inline void SelectChunk(const float* x, int64_t n, int64_t base, int64_t k,
                        std::vector<Entry>* buf, std::vector<Entry>* out) {
  if (n <= k) {
    for (int64_t j = 0; j < n; ++j) out->push_back({x[j], base + j});
    return;
  }
  // Small for small k: the threshold rises at each compaction, and until
  // it does most groups of a row of 10^4 scores pass the vectorised test
  // (a 256 floor kept it at the first entries' level for a whole row).
  const int64_t capacity = std::max<int64_t>(2 * k, kMinCapacity);
  buf->clear();
  buf->reserve(capacity + kGroup);
  for (int64_t j = 0; j < k; ++j) buf->push_back({x[j], base + j});
  Entry thr = Worst(*buf);
  int64_t j = k;
  // Scalar steps up to a group boundary relative to the chunk start.
  auto scalar = [&](int64_t j1) {
    for (; j < j1; ++j) {
      const Entry e{x[j], base + j};
      if (Better(e, thr)) buf->push_back(e);
    }
  };
  auto compact = [&]() {
    if (static_cast<int64_t>(buf->size()) >= capacity) {
      KeepBest(buf, k);
      thr = Worst(*buf);
    }
  };
  while (j < n) {
    const int64_t j1 = std::min(n, j + kGroup);
    if (j1 - j == kGroup && !std::isnan(thr.value)) {
      // Entries not > thr.value lose to all k held ones (module comment).
      if (AnyGreater(x + j, thr.value)) {
        for (; j < j1; ++j) {
          if (x[j] > thr.value) buf->push_back({x[j], base + j});
        }
      } else {
        j = j1;
      }
    } else {
      scalar(j1);  // the tail, or a NaN threshold (any number beats it)
    }
    compact();
  }
  if (static_cast<int64_t>(buf->size()) > k) KeepBest(buf, k);
  out->insert(out->end(), buf->begin(), buf->end());
}

// The sorted top k of candidates (at least k of them), written to values
// and indices.
inline void FinishRow(std::vector<Entry>* cand, int64_t k, float* values,
                      int32_t* indices) {
  if (static_cast<int64_t>(cand->size()) > k) KeepBest(cand, k);
  std::sort(cand->begin(), cand->end(), BetterCmp());
  for (int64_t q = 0; q < k; ++q) {
    values[q] = (*cand)[q].value;
    indices[q] = static_cast<int32_t>((*cand)[q].index);
  }
}

}  // namespace topk
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_TOPK_TOPK_KERNELS_H_
