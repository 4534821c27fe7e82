// CPU kernels of the uniform-sparse layer on a sparse input batch:
// Xmc>UniformSparseInvertedIndex, Xmc>UniformSparseMatmulSparseInput and its
// weight gradient.  See uniform_sparse_ops.cc for the op contracts.
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.1-3.3 (the uniform-sparse layer),
// here applied to the sparse tf-idf input itself and traversed feature by
// feature (the inverted index, CSR of the transposed connection matrix):
// the dense kernels do batch * num_labels * fan_in multiply-adds although
// almost every gathered input is zero, these do one per (stored entry,
// connected position) pair.
//
// CPU design (TensorFlow's intra-op thread pool, ::tensorflow::Shard, as in
// uniform_sparse_kernels.cc):
//  * Inverted index: a counting sort of the positions p = j * fan_in + k by
//    indices_flat[p].  The positions are cut into contiguous chunks, one
//    histogram per chunk (only as many chunks as keep the histograms at most
//    half the size of the index); a prefix sum in (feature, chunk) order
//    gives every chunk its write cursors, so the scatter is parallel and
//    each feature's list comes out in increasing p.
//  * Forward: the batch entries are bucketed by row (counting sort, stable),
//    then rows are sharded: a row's worker zeroes the row and adds
//    v * weights_flat[p] at p / fan_in for every listed p of every entry of
//    the row.  One writer per output row; sums in entry order, then p order.
//  * Weight gradient: the output is zeroed in parallel; the batch entries are
//    sorted by col (stable) into groups of one feature; a serial pass over
//    the groups' position lists checks that no position is listed twice
//    (so that each output element has one writer); then the groups are
//    sharded: for each listed p, grad_weights_flat[p] = sum over the group's
//    entries of v * backward[i, p / fan_in], zero backward entries skipped.
//  * Every kernel validates shapes and ranges and fails with
//    InvalidArgument naming the first offending entry; no shape CHECK-fails
//    (output shapes are built with TensorShape::BuildTensorShape).  The
//    matmul and its gradient check the inverted index where they read it:
//    its frame (sizes, offsets[0] = 0, offsets[D] = num_labels * fan_in) in
//    O(1), and, for every feature the batch stores, its offsets pair and the
//    entries of its list, before reading through them.  A kept index
//    (built once by Xmc>UniformSparseInvertedIndex, which checks the
//    indices it sorts) is then not re-read whole on every call; any bad
//    part the batch reads fails with the message of the whole index's check
//    (ValidateInvertedIndex), whose first bad entry may lie elsewhere.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

namespace {

// ---------------------------------------------------------------------------
// Validation (the shared checks and messages of ops/common/validation.h; the
// sharded first-bad searches of ops/common/bad_index.h).

// Checks the frame of an inverted index (offsets [D + 1], entries
// [num_connections]: ranks, sizes, offsets[0] = 0, offsets[D] =
// num_connections) and returns D.  O(1).
Status ValidateInvertedIndexFrame(const Tensor& offsets, const Tensor& entries,
                                  int64_t num_connections,
                                  int64_t* num_features) {
  TF_RETURN_IF_ERROR(CheckVector(offsets, "offsets"));
  TF_RETURN_IF_ERROR(CheckVector(entries, "entries"));
  if (offsets.NumElements() < 1) {
    return errors::InvalidArgument(
        "offsets must have num_features + 1 >= 1 elements, got 0");
  }
  const int64_t d = offsets.NumElements() - 1;
  const int64_t n = entries.NumElements();
  if (n != num_connections) {
    return errors::InvalidArgument(
        "entries has ", n, " elements but weights has num_labels * fan_in = ",
        num_connections, " (an inverted index lists every connection once)");
  }
  const int64_t* o = offsets.flat<int64_t>().data();
  if (o[0] != 0) {
    return errors::InvalidArgument("offsets[0] = ", o[0], " must be 0");
  }
  if (o[d] != n) {
    return errors::InvalidArgument("offsets[", d, "] = ", o[d],
                                   " must equal the number of entries ", n);
  }
  *num_features = d;
  return ::tensorflow::OkStatus();
}

// Checks the whole inverted index: its frame, non-decreasing offsets and
// every entry in [0, num_connections).  O(D + num_connections), sharded.
// The matmul kernels run it only to name what is wrong once a list they
// read is bad (ListIsBad).
template <typename Tidx>
Status ValidateInvertedIndex(OpKernelContext* ctx, const Tensor& offsets,
                             const Tensor& entries, int64_t num_connections) {
  int64_t d = 0;
  TF_RETURN_IF_ERROR(
      ValidateInvertedIndexFrame(offsets, entries, num_connections, &d));
  const int64_t n = num_connections;
  const int64_t* o = offsets.flat<int64_t>().data();
  const int64_t bad_offset = FirstBadPosition(
      ctx, d, [o](int64_t f) { return o[f + 1] < o[f]; }, /*cost=*/2);
  if (bad_offset >= 0) {
    return errors::InvalidArgument(
        "offsets[", bad_offset + 1, "] = ", o[bad_offset + 1], " < offsets[",
        bad_offset, "] = ", o[bad_offset], ": offsets must be non-decreasing");
  }
  const Tidx* e = entries.flat<Tidx>().data();
  const int64_t bad_entry = FirstOutOfRange(ctx, e, n, 0, n);
  if (bad_entry >= 0) {
    return OutOfRange("entries", entries.shape(), bad_entry,
                      static_cast<int64_t>(e[bad_entry]), 0, n,
                      "num_labels * fan_in");
  }
  return ::tensorflow::OkStatus();
}

// Whether feature f's offsets pair is outside 0 <= offsets[f] <=
// offsets[f + 1] <= n (reads those two offsets only).  f in [0, D).
inline bool OffsetsAreBad(const int64_t* off, int64_t n, int64_t f) {
  const int64_t a = off[f], z = off[f + 1];
  return a < 0 || a > z || z > n;
}

// Whether feature f's part of a framed inverted index is unsafe to read:
// OffsetsAreBad, or an entry of its list outside [0, n).  Reads offsets[f],
// offsets[f + 1] and (when they are sound) the list.  f in [0, D).
template <typename Tidx>
inline bool ListIsBad(const int64_t* off, const Tidx* ent, int64_t n,
                      int64_t f) {
  if (OffsetsAreBad(off, n, f)) return true;
  const int64_t a = off[f], z = off[f + 1];
  const uint64_t bound = static_cast<uint64_t>(n);
  bool bad = false;
  for (int64_t q = a; q < z; ++q) {  // branch-free: vectorised
    bad |= static_cast<uint64_t>(static_cast<int64_t>(ent[q])) >= bound;
  }
  return bad;
}

// The error of an inverted index one of whose read lists ListIsBad: the
// whole index's check names the first bad offset or entry.
template <typename Tidx>
Status BadListError(OpKernelContext* ctx, const Tensor& offsets,
                    const Tensor& entries, int64_t n, int64_t feature) {
  Status full = ValidateInvertedIndex<Tidx>(ctx, offsets, entries, n);
  if (!full.ok()) return full;
  return errors::Internal("the inverted index list of feature ", feature,
                          " failed its check, the whole index passed");
}

// rows / cols / values: vectors of one length; rows in [0, num_rows), cols
// in [0, num_features).  `rows_bound` names num_rows in messages.  The
// first bad entry e is reported (its row if that is bad, else its col).
Status ValidateSparseInput(OpKernelContext* ctx, const Tensor& rows,
                           const Tensor& cols, const Tensor& values,
                           int64_t num_rows, int64_t num_features,
                           const char* rows_bound) {
  TF_RETURN_IF_ERROR(CheckVector(rows, "rows"));
  TF_RETURN_IF_ERROR(CheckVector(cols, "cols"));
  TF_RETURN_IF_ERROR(CheckVector(values, "values"));
  const int64_t nnz = rows.dim_size(0);
  if (cols.dim_size(0) != nnz || values.dim_size(0) != nnz) {
    return errors::InvalidArgument(
        "rows, cols and values must have one length, got ", nnz, ", ",
        cols.dim_size(0), " and ", values.dim_size(0));
  }
  const int64_t* r = rows.flat<int64_t>().data();
  const int64_t* c = cols.flat<int64_t>().data();
  auto row_bad = [r, num_rows](int64_t e) {
    return r[e] < 0 || r[e] >= num_rows;
  };
  const int64_t bad = FirstBadPosition(
      ctx, nnz, [&row_bad, c, num_features](int64_t e) {
        return row_bad(e) || c[e] < 0 || c[e] >= num_features;
      });
  if (bad < 0) return ::tensorflow::OkStatus();
  if (row_bad(bad)) {
    return OutOfRange("rows", rows.shape(), bad, r[bad], 0, num_rows,
                      rows_bound);
  }
  return OutOfRange("cols", cols.shape(), bad, c[bad], 0, num_features,
                    "num_features = offsets size - 1");
}

// weights [m, s] (or, in the gradient, only its shape).
Status WeightsDims(const Tensor& weights, int64_t* m, int64_t* s) {
  TF_RETURN_IF_ERROR(CheckMatrix(weights, "weights"));
  *m = weights.dim_size(0);
  *s = weights.dim_size(1);
  return ::tensorflow::OkStatus();
}

// ---------------------------------------------------------------------------
// Hot loops.

// p / fan_in: a shift when fan_in is a power of two, else a 32-bit division
// when the positions fit (about half the latency of a 64-bit one).
struct LabelOf {
  explicit LabelOf(int64_t fan_in, int64_t num_connections)
      : s(fan_in),
        s32(static_cast<uint32_t>(fan_in)),
        pow2(fan_in > 0 && (fan_in & (fan_in - 1)) == 0),
        narrow(num_connections <= std::numeric_limits<uint32_t>::max()) {
    while (pow2 && (int64_t{1} << shift) < fan_in) ++shift;
  }
  int64_t operator()(int64_t p) const {
    if (pow2) return p >> shift;
    if (narrow) return static_cast<uint32_t>(p) / s32;
    return p / s;
  }
  int64_t s;
  uint32_t s32;
  bool pow2, narrow;
  int shift = 0;
};

// Stable counting sort of entry ids by key (keys in [0, num_keys)):
// ids of key k are order[start[k] : start[k + 1]], in increasing id.
void BucketByKey(const int64_t* keys, int64_t n, int64_t num_keys,
                 std::vector<int64_t>* start, std::vector<int64_t>* order) {
  start->assign(num_keys + 1, 0);
  for (int64_t e = 0; e < n; ++e) ++(*start)[keys[e] + 1];
  for (int64_t k = 0; k < num_keys; ++k) (*start)[k + 1] += (*start)[k];
  std::vector<int64_t> cursor(start->begin(), start->end() - 1);
  order->resize(n);
  for (int64_t e = 0; e < n; ++e) (*order)[cursor[keys[e]]++] = e;
}

// ---------------------------------------------------------------------------
// Xmc>UniformSparseInvertedIndex

template <typename Tidx>
class UniformSparseInvertedIndexOp : public OpKernel {
 public:
  explicit UniformSparseInvertedIndexOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckMatrix(indices, "indices"));
    int64_t d = 0;
    OP_REQUIRES_OK(ctx, NonNegativeScalar(ctx->input(1), "num_features", &d));
    OP_REQUIRES(ctx, d < std::numeric_limits<int64_t>::max(),
                errors::InvalidArgument("num_features = ", d, " is too large"));
    const int64_t n = indices.NumElements();
    constexpr bool wide = std::is_same<Tidx, int64_t>::value;
    OP_REQUIRES(ctx, wide || n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument(
                    "num_labels * fan_in = ", n,
                    " does not fit int32 entries: use Tidx = int64"));
    TensorShape offsets_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({d + 1}, &offsets_shape));
    Tensor* offsets_t = nullptr;
    Tensor* entries_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, offsets_shape, &offsets_t));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, TensorShape({n}), &entries_t));
    int64_t* offsets = offsets_t->flat<int64_t>().data();
    Tidx* entries = entries_t->flat<Tidx>().data();
    const int32_t* idx = indices.flat<int32_t>().data();

    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    // Chunks of positions with one histogram each; their total size
    // (chunks * D) stays at most n / 2, and small indices use one chunk.
    int64_t chunks = 1;
    if (n >= (int64_t{1} << 15) && d > 0) {
      chunks = std::max<int64_t>(
          1, std::min<int64_t>(workers->num_threads, n / (2 * d)));
    }
    const int64_t per_chunk = (n + chunks - 1) / chunks;
    // Counters and cursors are <= n, so Tidx holds them (int32 halves their
    // cache footprint in the scatter).  A TensorFlow temp: a failed
    // allocation is an error, not an abort.
    Tensor counts_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DataTypeToEnum<Tidx>::v(),
                            TensorShape({chunks * d}), &counts_t));
    Tidx* counts = counts_t.flat<Tidx>().data();
    std::fill(counts, counts + chunks * d, Tidx{0});
    const uint64_t bound = static_cast<uint64_t>(d);
    // The range check rides on the histogram pass (a chunk stops at its
    // first bad position; chunks are contiguous, so the smallest recorded
    // position is the first bad one).
    FirstBad first_bad;
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, chunks, per_chunk * 3,
        [&](int64_t start, int64_t limit) {
          for (int64_t c = start; c < limit; ++c) {
            Tidx* count = counts + c * d;
            const int64_t p1 = std::min(n, (c + 1) * per_chunk);
            for (int64_t p = c * per_chunk; p < p1; ++p) {
              const uint64_t f =
                  static_cast<uint64_t>(static_cast<int64_t>(idx[p]));
              if (f >= bound) {  // negative values wrap to >= 2^63
                first_bad.Record(p);
                break;
              }
              ++count[f];
            }
          }
        });
    OP_REQUIRES(ctx, !first_bad.found(),
                OutOfRange("indices", indices.shape(), first_bad.get(),
                           idx[first_bad.get()], 0, d, "num_features"));
    // Exclusive prefix sum in (feature, chunk) order: counts become cursors.
    int64_t running = 0;
    for (int64_t f = 0; f < d; ++f) {
      offsets[f] = running;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t k = counts[c * d + f];
        counts[c * d + f] = static_cast<Tidx>(running);
        running += k;
      }
    }
    offsets[d] = running;  // == n: every index is in range
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, chunks, per_chunk * 4,
        [&](int64_t start, int64_t limit) {
          for (int64_t c = start; c < limit; ++c) {
            Tidx* cursor = counts + c * d;
            const int64_t p1 = std::min(n, (c + 1) * per_chunk);
            for (int64_t p = c * per_chunk; p < p1; ++p) {
              entries[cursor[idx[p]]++] = static_cast<Tidx>(p);
            }
          }
        });
  }
};

// ---------------------------------------------------------------------------
// Xmc>UniformSparseMatmulSparseInput

template <typename Tidx>
class UniformSparseMatmulSparseInputOp : public OpKernel {
 public:
  explicit UniformSparseMatmulSparseInputOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    const Tensor& cols = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& offsets = ctx->input(4);
    const Tensor& entries = ctx->input(5);
    const Tensor& weights = ctx->input(6);
    int64_t batch = 0, m = 0, s = 0, d = 0;
    OP_REQUIRES_OK(ctx, NonNegativeScalar(ctx->input(3), "batch_size", &batch));
    OP_REQUIRES_OK(ctx, WeightsDims(weights, &m, &s));
    OP_REQUIRES_OK(ctx, ValidateInvertedIndexFrame(offsets, entries, m * s,
                                                   &d));
    OP_REQUIRES_OK(ctx, ValidateSparseInput(ctx, rows, cols, values, batch, d,
                                            "batch_size"));
    // The lists the batch reads (cols are in [0, D) now), each distinct
    // feature's once: O(nnz + D / 64 + the lists' lengths).
    {
      const int64_t* c = cols.flat<int64_t>().data();
      const int64_t* o = offsets.flat<int64_t>().data();
      const Tidx* e = entries.flat<Tidx>().data();
      std::vector<uint64_t> checked((d + 63) / 64, 0);
      for (int64_t q = 0; q < rows.dim_size(0); ++q) {
        const int64_t f = c[q];
        const uint64_t bit = uint64_t{1} << (f & 63);
        if (checked[f >> 6] & bit) continue;
        checked[f >> 6] |= bit;
        OP_REQUIRES(ctx, !ListIsBad(o, e, m * s, f),
                    BadListError<Tidx>(ctx, offsets, entries, m * s, f));
      }
    }
    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({batch, m}, &out_shape));
    Tensor* scores_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &scores_t));
    if (batch == 0 || m == 0) return;
    float* scores = scores_t->flat<float>().data();

    const int64_t nnz = rows.dim_size(0);
    std::vector<int64_t> row_start, order;
    BucketByKey(rows.flat<int64_t>().data(), nnz, batch, &row_start, &order);
    const int64_t* col = cols.flat<int64_t>().data();
    const float* val = values.flat<float>().data();
    const int64_t* off = offsets.flat<int64_t>().data();
    const Tidx* ent = entries.flat<Tidx>().data();
    const float* w = weights.flat<float>().data();
    const LabelOf label_of(s, m * s);
    // Expected products per row: (nnz / batch) * (m * s / D).
    const int64_t per_row =
        m + 4 * (nnz / batch + 1) * (m * s / std::max<int64_t>(d, 1) + 1);
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, batch, per_row,
        [&](int64_t start, int64_t limit) {
          for (int64_t i = start; i < limit; ++i) {
            float* out = scores + i * m;
            std::fill(out, out + m, 0.0f);
            for (int64_t q = row_start[i]; q < row_start[i + 1]; ++q) {
              const int64_t e = order[q];
              const int64_t f = col[e];
              const float v = val[e];
              const Tidx* list = ent + off[f];
              const int64_t len = off[f + 1] - off[f];
              for (int64_t t = 0; t < len; ++t) {
                const int64_t p = static_cast<int64_t>(list[t]);
                out[label_of(p)] += v * w[p];
              }
            }
          }
        });
  }
};

// ---------------------------------------------------------------------------
// Xmc>UniformSparseMatmulSparseInputGradWeights

template <typename Tidx>
class UniformSparseMatmulSparseInputGradWeightsOp : public OpKernel {
 public:
  explicit UniformSparseMatmulSparseInputGradWeightsOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    const Tensor& cols = ctx->input(2);
    const Tensor& values = ctx->input(3);
    const Tensor& offsets = ctx->input(4);
    const Tensor& entries = ctx->input(5);
    const Tensor& weights = ctx->input(6);
    int64_t m = 0, s = 0, d = 0;
    OP_REQUIRES_OK(ctx, WeightsDims(weights, &m, &s));
    OP_REQUIRES_OK(ctx, CheckMatrix(backward, "backward"));
    OP_REQUIRES(ctx, backward.dim_size(1) == m,
                errors::InvalidArgument(
                    "backward shape ", backward.shape().DebugString(),
                    " must be [batch, ", m, "] ([batch, num_labels])"));
    const int64_t batch = backward.dim_size(0);
    const int64_t n = m * s;
    OP_REQUIRES_OK(ctx, ValidateInvertedIndexFrame(offsets, entries, n, &d));
    OP_REQUIRES_OK(ctx, ValidateSparseInput(ctx, rows, cols, values, batch, d,
                                            "rows of backward"));
    Tensor* grad_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, weights.shape(), &grad_t));
    if (n == 0) return;
    float* grad = grad_t->flat<float>().data();
    const int64_t nnz = rows.dim_size(0);
    const int64_t* row = rows.flat<int64_t>().data();
    const int64_t* col = cols.flat<int64_t>().data();
    const float* val = values.flat<float>().data();
    const int64_t* off = offsets.flat<int64_t>().data();
    const Tidx* ent = entries.flat<Tidx>().data();
    const float* back = backward.flat<float>().data();

    // Group the entries by feature (stable: entry order within a group).
    std::vector<int64_t> order(nnz);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [col](int64_t a, int64_t b) { return col[a] < col[b]; });
    std::vector<int64_t> group_start;  // groups [start[u], start[u + 1])
    int64_t touched = 0, work = 0;
    for (int64_t q = 0; q < nnz; ++q) {
      if (q == 0 || col[order[q]] != col[order[q - 1]]) {
        // The lists the batch reads: their offsets here, their entries in
        // the pass below (each list read once).
        const int64_t f = col[order[q]];
        OP_REQUIRES(ctx, !OffsetsAreBad(off, n, f),
                    BadListError<Tidx>(ctx, offsets, entries, n, f));
        group_start.push_back(q);
        touched += off[f + 1] - off[f];
      }
    }
    const int64_t groups = static_cast<int64_t>(group_start.size());
    group_start.push_back(nnz);
    for (int64_t u = 0; u < groups; ++u) {
      const int64_t f = col[order[group_start[u]]];
      work += (off[f + 1] - off[f]) * (group_start[u + 1] - group_start[u]);
    }

    // Each listed position of the batch's features must be in [0, n) (else
    // the whole index's check names the first bad entry) and occur once:
    // its group's worker is then its only writer.  A bad entry anywhere in
    // the read lists is reported before a repeat.
    if (touched > 0) {
      std::vector<uint64_t> seen((n + 63) / 64, 0);
      int64_t repeat = -1, repeat_feature = -1;  // the first repeat found
      for (int64_t u = 0; u < groups; ++u) {
        const int64_t f = col[order[group_start[u]]];
        for (int64_t q = off[f]; q < off[f + 1]; ++q) {
          const uint64_t p =
              static_cast<uint64_t>(static_cast<int64_t>(ent[q]));
          OP_REQUIRES(ctx, p < static_cast<uint64_t>(n),
                      BadListError<Tidx>(ctx, offsets, entries, n, f));
          const uint64_t bit = uint64_t{1} << (p & 63);
          if ((seen[p >> 6] & bit) != 0 && repeat < 0) {
            repeat = q;
            repeat_feature = f;
          }
          seen[p >> 6] |= bit;
        }
      }
      OP_REQUIRES(ctx, repeat < 0,
                  errors::InvalidArgument(
                      "entries[", repeat, "] = ",
                      static_cast<int64_t>(ent[repeat]),
                      " (listed for feature ", repeat_feature,
                      ") repeats a position already listed for a feature of "
                      "the batch: an inverted index lists every position "
                      "once"));
    }

    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n, 1,
                        [&](int64_t start, int64_t limit) {
                          std::fill(grad + start, grad + limit, 0.0f);
                        });
    if (groups == 0) return;
    const LabelOf label_of(s, n);
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, groups,
        4 * (work / groups + 1), [&](int64_t start, int64_t limit) {
          std::vector<const float*> g_rows;  // backward rows of the group
          std::vector<float> g_vals;
          for (int64_t u = start; u < limit; ++u) {
            const int64_t q0 = group_start[u], q1 = group_start[u + 1];
            const int64_t f = col[order[q0]];
            g_rows.clear();
            g_vals.clear();
            for (int64_t q = q0; q < q1; ++q) {
              g_rows.push_back(back + row[order[q]] * m);
              g_vals.push_back(val[order[q]]);
            }
            const int64_t k = q1 - q0;
            for (int64_t t = off[f]; t < off[f + 1]; ++t) {
              const int64_t p = static_cast<int64_t>(ent[t]);
              const int64_t j = label_of(p);
              float acc = 0.0f;
              for (int64_t r = 0; r < k; ++r) {
                const float g = g_rows[r][j];
                if (g != 0.0f) acc += g_vals[r] * g;  // zero signal: skipped
              }
              grad[p] = acc;
            }
          }
        });
  }
};

#define REGISTER_CPU(Tidx)                                                   \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseInvertedIndex")             \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<Tidx>("Tidx"),                 \
                          UniformSparseInvertedIndexOp<Tidx>);               \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulSparseInput")         \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<float>("T")                    \
                              .TypeConstraint<Tidx>("Tidx"),                 \
                          UniformSparseMatmulSparseInputOp<Tidx>);           \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("Xmc>UniformSparseMatmulSparseInputGradWeights")                  \
          .Device(DEVICE_CPU)                                                \
          .TypeConstraint<float>("T")                                        \
          .TypeConstraint<Tidx>("Tidx"),                                     \
      UniformSparseMatmulSparseInputGradWeightsOp<Tidx>);

REGISTER_CPU(int32_t);
REGISTER_CPU(int64_t);
#undef REGISTER_CPU

}  // namespace
}  // namespace xmc_tf
