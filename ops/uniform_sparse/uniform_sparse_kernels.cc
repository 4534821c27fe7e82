// Op kernels of the uniform-sparse product and its gradients: one OpKernel
// class per op, templated on the device, calling the functors declared in
// uniform_sparse_kernels.h (CPU here; GPU: the launchers of
// uniform_sparse_kernels.cu.cc).  See uniform_sparse_ops.cc for the op
// contracts.
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3, Algorithms 1-3.
//
// CPU design (every functor runs on TensorFlow's intra-op thread pool; the
// vector loops are in uniform_sparse_cpu_loops.h, compiled for AVX-512,
// AVX2 + FMA and baseline x86-64 and picked at run time by CPU features):
//  * Forward: features are first transposed to featT [num_features, bp]
//    (float32, the batch padded with zeros to bp, a multiple of 16).  Labels
//    are processed in tiles of kTile; every connection (j, k) adds
//    weights[j, k] * featT[indices[j, k], :] to the label's accumulators,
//    held in vector registers (four independent partial sums over k).  The
//    tile's results are written to scores[:, j0:j0+kTile] row by row.
//  * Gradients (GradientsCpu: both, as Xmc>UniformSparseMatmulGrad, the
//    registered gradient, or either one, as the two single-gradient ops),
//    by the estimated density of the backward signal:
//    - a sparse signal (fewer than bp / kSparseSignalFactor non-zeros per
//      label column on average) goes instance-major
//      (GradientsBySignalRows): the backward rows are read front to back
//      once and their non-zero entries kept (SignalEntries, found and
//      compressed a vector at a time); then, per span of labels whose
//      indices, weights and grad_weights rows fit in L2, every instance's
//      entries in the span add g * features[i, indices[j, :]] to
//      grad_weights[j, :] (hardware gathers) and g * weights[j, :] to row
//      i of the thread's [batch, num_features] features-gradient buffer,
//      which stays in L1 while the instance's entries are applied.  The
//      work is proportional to the non-zeros (Sec. 3.3); a span's labels
//      that some entry reads have their indices range-checked before the
//      span is applied;
//    - a denser one: one pass over the labels in blocks of kSignalBlock.
//      A block's signal backward[:, j0:j0+128] is loaded (TileSignal) as
//      dense columns (as per-label lists of non-zeros for a sparse signal
//      whose instance-major buffers would exceed kMaxScatterBytes).  Then
//      per label: an all-zero column is skipped without
//      reading indices or weights (grad_weights[j, :] = 0); a column with
//      at least bp / kDenseColumnFactor non-zeros takes the vector loops
//      (the dot products of the column with the featT rows of its
//      connections, sixteen connections at a time; the scatter of
//      weights[j, k] * column into row indices[j, k] of the thread's gT
//      [num_features, bp] buffer); a sparser one costs one update per
//      non-zero and connection.  The gT buffers are summed into
//      grad_features at the end.  When the signal has less than one
//      non-zero per column on average (or the buffers would exceed
//      kMaxScatterBytes), grad_features is computed by instance rows
//      instead (GradFeaturesByRows: each unit owns its output row; zero
//      runs of the row are skipped 16 at a time).
//  * In every path (and on the GPU) a zero backward[i, j] contributes
//    exactly 0, even against an inf / NaN feature or weight (no 0 * inf =
//    NaN): which outputs are non-finite does not depend on the density of
//    backward or on the path.
//  * Every kernel validates ranks and shapes, and its functor the range of
//    the indices it reads, and fails with InvalidArgument naming the
//    offending entry: the forward checks every index first; the gradients
//    check a label's row of indices where they first read it (only labels
//    with a non-zero signal), before any use as an address, and report
//    the smallest bad position read (an index of a label without signal
//    is never read; the forward, which every training step runs first,
//    checks them all).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/gpu.h"
#include "ops/common/sum_chunks.h"
#include "ops/common/validation.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_loops.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

namespace {

constexpr int64_t kTile = 16;  // labels per tile (forward)
// Labels per block of the gradients' signal scan (TileSignal): 512 bytes
// of each backward row per visit, so rows are read in whole cache lines
// that the prefetcher follows.
constexpr int64_t kSignalBlock = 128;
// The features gradient takes the tiled (transposed-forward) path when the
// backward signal has at least this many non-zeros per label column on
// average (estimated), and its per-thread buffers fit in kMaxScatterBytes.
constexpr double kDenseColumnEntries = 1.0;
// A label column with at least bp / kDenseColumnFactor non-zeros takes the
// vectorised dense loops; a sparser one visits only its non-zeros (scalar
// gathers / scatters, several times the cost per entry of the vector loops).
constexpr int64_t kDenseColumnFactor = 32;
// The gradients go instance-major, visiting only the signal's non-zeros
// (GradientsBySignalRows), when the signal has fewer than bp /
// kSparseSignalFactor non-zeros per label column on average (estimated):
// about 10x the cost per non-zero of the dense loops, whose cost does not
// depend on the density, so the instance-major path stays ahead up to
// about 1/10 of the entries non-zero.
constexpr int64_t kSparseSignalFactor = 16;
constexpr int64_t kMaxScatterBytes = int64_t{1} << 30;

using cpu_loops::CpuIsa;
using cpu_loops::Isa;
using cpu_loops::PaddedBatch;

// ---------------------------------------------------------------------------
// Validation shared by the CPU and GPU kernels (the index range: the CPU
// functors below, the GPU launchers on the device).

// Checks ranks and shapes of the operands that are present (nullptr = absent).
Status ValidateShapes(const Tensor* features, const Tensor& indices,
                      const Tensor* weights, const Tensor* backward,
                      UniformSparseDims* d) {
  TF_RETURN_IF_ERROR(CheckMatrix(indices, "indices"));
  d->num_labels = indices.dim_size(0);
  d->fan_in = indices.dim_size(1);
  if (features != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*features, "features"));
    d->batch = features->dim_size(0);
    d->num_features = features->dim_size(1);
    TF_RETURN_IF_ERROR(CheckInt32Indexable(d->num_features, "num_features"));
  }
  if (weights != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*weights, "weights"));
    TF_RETURN_IF_ERROR(CheckSameShape(*weights, "weights", indices, "indices",
                                      "[num_labels, fan_in]"));
  }
  if (backward != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*backward, "backward"));
    if (backward->dim_size(0) != d->batch ||
        backward->dim_size(1) != d->num_labels) {
      return errors::InvalidArgument(
          "backward shape ", backward->shape().DebugString(), " must be [",
          d->batch, ", ", d->num_labels, "] ([batch, num_labels])");
    }
  }
  return ::tensorflow::OkStatus();
}

// ---------------------------------------------------------------------------
// Scalar helpers (the vectorised loops are in uniform_sparse_cpu_loops.h).

// Whether the n signal values p[0:n] are all zero (+0 or -0).  For float
// one OR over the bits without the sign (vectorised): a run of zeros, the
// common case of a squared-hinge signal, costs a fraction of a cycle per
// value instead of a compare and branch each.
template <typename T>
inline bool AllZero(const T* p, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    if (static_cast<float>(p[k]) != 0.0f) return false;
  }
  return true;
}
template <>
inline bool AllZero<float>(const float* p, int64_t n) {
  if (n == kTile) {  // the common case: a constant trip count, unrolled
    uint32_t any = 0;
    for (int64_t k = 0; k < kTile; ++k) {
      uint32_t u;
      std::memcpy(&u, p + k, sizeof(u));
      any |= u << 1;
    }
    return any == 0;
  }
  uint32_t any = 0;
  for (int64_t k = 0; k < n; ++k) {
    uint32_t u;
    std::memcpy(&u, p + k, sizeof(u));
    any |= u << 1;  // drops the sign bit: -0.0f counts as zero
  }
  return any == 0;
}

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

// Fails the op with InvalidArgument naming indices[p] (p: a flat position).
void FailIndex(OpKernelContext* ctx, const int32_t* idx,
               const UniformSparseDims& d, int64_t p) {
  ctx->CtxFailure(OutOfRange("indices", TensorShape({d.num_labels, d.fan_in}),
                             p, idx[p], 0, d.num_features, "num_features"));
}

// sum_i a[i] * b[i] over the terms with a[i] != 0: a zero entry of the
// backward signal `a` contributes exactly 0, also against an inf or NaN
// feature in `b` (where the product would be NaN).  This is what skipping
// zero entries means (Sec. 3.3).  The vectorised dense dot products run
// first; a finite result implies that every product was finite, and it then
// equals this masked sum (adding a +-0 product to a sum that starts at +0
// changes nothing).  Only a non-finite result is recomputed here (rare:
// inf/NaN features or overflow).
float MaskedDot(const float* a, const float* b, int64_t n) {
  float t = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != 0.0f) t += a[i] * b[i];
  }
  return t;
}

bool AllFinite(const float* w, int64_t n) {
  float acc = 0.0f;  // inf/NaN anywhere makes w * 0 NaN
  for (int64_t k = 0; k < n; ++k) acc += w[k] * 0.0f;
  return acc == 0.0f;
}

// The backward signal of a block of labels, backward[:, j0:j0+nt] (nt <=
// kSignalBlock), in the form each label's work wants: the number of
// non-zeros of every label column, and for a label either its non-zero
// entries as (instance, value) lists in instance order (sparse work,
// proportional to the non-zeros: Sec. 3.3) or its dense column zero-padded
// to bp (the vectorised loops).
//
// Two ways to load, picked per op from the estimated density (a
// performance choice only; every accessor gives the same values either
// way):
//  * dense: the block's columns are gathered (one pass over its rows); a
//    label's lists are built from its column when asked for;
//  * sparse: the block's rows are read kTile values at a time and an
//    all-zero run is skipped with one test (AllZero); the non-zeros go to
//    the lists, and a label's column is built from them when asked for.
//    A sparse signal then costs about one read of backward.
template <typename T>
class TileSignal {
 public:
  TileSignal(int64_t batch, int64_t bp, bool dense)
      : batch_(batch),
        bp_(bp),
        dense_(dense),
        instance_(kSignalBlock * batch),
        value_(kSignalBlock * batch),
        count_(kSignalBlock),
        listed_(kSignalBlock),
        column_(dense ? kSignalBlock * bp : bp) {}

  void Load(const T* back, int64_t num_labels, int64_t j0, int64_t nt) {
    std::fill(count_.begin(), count_.begin() + nt, 0);
    std::fill(listed_.begin(), listed_.begin() + nt, !dense_);
    if (dense_) {
      for (int64_t i = 0; i < batch_; ++i) {
        const T* row = back + i * num_labels + j0;
        for (int64_t t = 0; t < nt; ++t) {
          const float g = static_cast<float>(row[t]);
          column_[t * bp_ + i] = g;
          count_[t] += g != 0.0f;
        }
      }
      for (int64_t t = 0; t < nt; ++t) {
        std::fill(column_.begin() + t * bp_ + batch_,
                  column_.begin() + (t + 1) * bp_, 0.0f);
      }
      return;
    }
    for (int64_t i = 0; i < batch_; ++i) {
      const T* row = back + i * num_labels + j0;
      // The same row's part of the next block: one stream per row is more
      // than the hardware prefetcher follows (a hint; never faults).
      for (int64_t c = 0; c < kSignalBlock; c += 64 / sizeof(T)) {
        __builtin_prefetch(row + kSignalBlock + c);
      }
      for (int64_t t0 = 0; t0 < nt; t0 += kTile) {
        const int64_t t1 = std::min(nt, t0 + kTile);
        if (AllZero(row + t0, t1 - t0)) continue;
        for (int64_t t = t0; t < t1; ++t) {
          const float g = static_cast<float>(row[t]);
          if (g == 0.0f) continue;
          const int64_t q = t * batch_ + count_[t]++;
          instance_[q] = static_cast<int32_t>(i);
          value_[q] = g;
        }
      }
    }
  }

  // Number of non-zero entries of label t's column.
  int64_t count(int64_t t) const { return count_[t]; }

  // Label t's non-zero entries: count(t) instances (increasing) and values.
  const int32_t* instances(int64_t t) {
    List(t);
    return instance_.data() + t * batch_;
  }
  const float* values(int64_t t) {
    List(t);
    return value_.data() + t * batch_;
  }

  // Label t's column [bp], zero where the signal is zero and in the padding.
  const float* Column(int64_t t) {
    if (dense_) return column_.data() + t * bp_;
    std::fill(column_.begin(), column_.end(), 0.0f);
    const int32_t* inst = instance_.data() + t * batch_;
    const float* val = value_.data() + t * batch_;
    for (int64_t q = 0; q < count_[t]; ++q) column_[inst[q]] = val[q];
    return column_.data();
  }

 private:
  void List(int64_t t) {
    if (listed_[t]) return;
    const float* col = column_.data() + t * bp_;
    int64_t q = t * batch_;
    for (int64_t i = 0; i < batch_; ++i) {
      if (col[i] == 0.0f) continue;
      instance_[q] = static_cast<int32_t>(i);
      value_[q++] = col[i];
    }
    listed_[t] = true;
  }

  int64_t batch_, bp_;
  bool dense_;
  std::vector<int32_t> instance_;
  std::vector<float> value_;
  std::vector<int64_t> count_;
  std::vector<char> listed_;
  std::vector<float> column_;
};

// Tiled parallel transpose of features [batch, num_features] into float32
// featT [num_features, bp] (bp >= batch; columns batch..bp-1 zero).
template <typename T>
void TransposeFeatures(OpKernelContext* ctx, const T* features, int64_t batch,
                       int64_t num_features, int64_t bp, float* featT) {
  constexpr int64_t kBlock = 32;
  const int64_t row_blocks = (num_features + kBlock - 1) / kBlock;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, row_blocks, bp * kBlock * 2,
      [&](int64_t start, int64_t limit) {
        for (int64_t rb = start; rb < limit; ++rb) {
          const int64_t f0 = rb * kBlock;
          const int64_t f1 = std::min(num_features, f0 + kBlock);
          for (int64_t i0 = 0; i0 < batch; i0 += kBlock) {
            const int64_t i1 = std::min(batch, i0 + kBlock);
            for (int64_t i = i0; i < i1; ++i) {
              const T* src = features + i * num_features;
              for (int64_t f = f0; f < f1; ++f) {
                featT[f * bp + i] = static_cast<float>(src[f]);
              }
            }
          }
          if (bp > batch) {
            for (int64_t f = f0; f < f1; ++f) {
              std::fill(featT + f * bp + batch, featT + (f + 1) * bp, 0.0f);
            }
          }
        }
      });
}

// The n values at p as float32: p itself for float, else a converted copy
// held in `storage`.
template <typename T>
const float* AsFloat(const T* p, int64_t n, std::vector<float>* storage) {
  storage->resize(n);
  for (int64_t i = 0; i < n; ++i) (*storage)[i] = static_cast<float>(p[i]);
  return storage->data();
}
template <>
const float* AsFloat<float>(const float* p, int64_t, std::vector<float>*) {
  return p;
}

// Estimated fraction of non-zeros in backward from a fixed pseudo-random
// sample (a performance heuristic only; results never depend on it).
template <typename T>
double EstimateDensity(const T* back, int64_t n) {
  if (n == 0) return 0.0;
  constexpr int64_t kSamples = 4096;
  if (n <= kSamples) {
    int64_t nz = 0;
    for (int64_t p = 0; p < n; ++p) nz += static_cast<float>(back[p]) != 0.0f;
    return static_cast<double>(nz) / n;
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  int64_t nz = 0;
  for (int64_t s = 0; s < kSamples; ++s) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    nz += static_cast<float>(back[(state >> 17) % static_cast<uint64_t>(n)]) !=
          0.0f;
  }
  return static_cast<double>(nz) / kSamples;
}

// Whether a signal of this estimated density is best loaded as dense
// columns (TileSignal): when a typical column takes the dense loops.
inline bool DenseSignal(double density, int64_t batch, int64_t bp) {
  return density * batch * kDenseColumnFactor >= bp;
}

// Whether a signal of this estimated density takes the instance-major
// path (GradientsBySignalRows).
inline bool SparseSignal(double density, int64_t batch, int64_t bp) {
  return density * batch * kSparseSignalFactor < bp;
}

// ---------------------------------------------------------------------------
// CPU implementation.

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
  std::vector<float> w_storage;
  const float* w = AsFloat(weights, d.num_labels * d.fan_in, &w_storage);
  const Isa isa = CpuIsa();
  const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, num_tiles,
      2 * kTile * d.fan_in * bp, [&](int64_t start, int64_t limit) {
        std::vector<float> acc(kTile * bp);
        for (int64_t tile = start; tile < limit; ++tile) {
          const int64_t j0 = tile * kTile;
          const int64_t nt = std::min(kTile, d.num_labels - j0);
          cpu_loops::ForwardLabels(isa, featT, bp, idx + j0 * d.fan_in,
                                   w + j0 * d.fan_in, nt, d.fan_in,
                                   acc.data());
          for (int64_t i = 0; i < d.batch; ++i) {
            T* row = out + i * d.num_labels + j0;
            for (int64_t t = 0; t < nt; ++t) {
              row[t] = static_cast<T>(acc[t * bp + i]);
            }
          }
        }
      });
}

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

// One label's share of both gradients, from its signal (count(t) = n > 0
// non-zeros).
template <typename T>
struct LabelGradients {
  const UniformSparseDims& d;
  const T* feat;       // features [batch, num_features]
  const float* featT;  // [num_features, bp] or nullptr
  const float* w;      // weights as float32 (the features gradient only)
  int64_t bp;
  Isa isa;

  // grad_weights[j, :] into gj (fan_in values).
  void Weights(TileSignal<T>* signal, int64_t t, int64_t n, const int32_t* ij,
               float* sums, T* gj) const {
    if (featT != nullptr && n * kDenseColumnFactor >= bp) {
      const float* col = signal->Column(t);
      cpu_loops::GradWeightsDense(isa, featT, bp, col, ij, d.fan_in, sums);
      for (int64_t k = 0; k < d.fan_in; ++k) {
        float v = sums[k];
        if (!std::isfinite(v)) {  // see MaskedDot
          v = MaskedDot(col, featT + static_cast<int64_t>(ij[k]) * bp,
                        d.batch);
        }
        gj[k] = static_cast<T>(v);
      }
      return;
    }
    // Few non-zeros: each non-zero (i, g) adds g * features[i, ij[:]] (a
    // gather from one features row) to the fan_in sums.
    const int32_t* inst = signal->instances(t);
    const float* val = signal->values(t);
    std::fill(sums, sums + d.fan_in, 0.0f);
    for (int64_t q = 0; q < n; ++q) {
      const T* frow = feat + inst[q] * d.num_features;
      const float g = val[q];
      for (int64_t k = 0; k < d.fan_in; ++k) {
        sums[k] += g * static_cast<float>(frow[ij[k]]);
      }
    }
    for (int64_t k = 0; k < d.fan_in; ++k) gj[k] = static_cast<T>(sums[k]);
  }

  // Adds label j's part of the features gradient to gT [num_features, bp].
  void Features(TileSignal<T>* signal, int64_t t, int64_t n,
                const int32_t* ij, const float* wj, float* gT) const {
    if (n * kDenseColumnFactor >= bp && AllFinite(wj, d.fan_in)) {
      cpu_loops::GradFeaturesScatter(isa, gT, bp, signal->Column(t), ij, wj,
                                     d.fan_in);
      return;
    }
    // Few non-zeros (or a non-finite weight, which only the non-zero
    // entries may multiply): one update per non-zero and connection.
    const int32_t* inst = signal->instances(t);
    const float* val = signal->values(t);
    for (int64_t q = 0; q < n; ++q) {
      float* gi = gT + inst[q];
      const float g = val[q];
      for (int64_t k = 0; k < d.fan_in; ++k) {
        gi[static_cast<int64_t>(ij[k]) * bp] += g * wj[k];
      }
    }
  }
};

// Labels per span of the sparse-signal path (GradientsBySignalRows): the
// span's indices, weights and weights-gradient rows (12 * fan_in bytes a
// label) take about kSpanBytes, so they stay in a core's L2 cache while the
// span's signal entries are applied.
constexpr int64_t kSpanBytes = int64_t{192} << 10;

inline int64_t SpanLabels(int64_t fan_in) {
  const int64_t n = kSpanBytes / (12 * std::max<int64_t>(1, fan_in));
  return std::min<int64_t>(4096, std::max<int64_t>(16, n / 16 * 16));
}

// Hints the cache lines of p[0:bytes] into the cache (never faults).
inline void PrefetchBytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b);
}

// The non-zero entries of a range of backward rows, row by row and within
// a row in label order: (label relative to its span, value) pairs, and for
// row r and span sp the index of the first entry, start(r, sp) (the span's
// entries end at start(r, sp + 1); start(r, num_spans) is the next row's
// start(0)).
class SignalEntries {
 public:
  SignalEntries(int64_t rows, int64_t num_spans, int64_t expected)
      : num_spans_(num_spans), start_(rows * num_spans + 1, 0) {
    Grow(expected, 0);
  }
  // Appends the non-zeros of row r's span sp, sig[0:n] (rows and, within a
  // row, spans in order).
  void Add(Isa isa, int64_t r, int64_t sp, const float* sig, int64_t n) {
    const int64_t begin = start_[r * num_spans_ + sp];
    if (begin + n + 16 > capacity_) Grow(2 * (begin + n + 16), begin);
    const int64_t count = cpu_loops::NonZeros(isa, sig, n, pos_.get() + begin,
                                              val_.get() + begin);
    start_[r * num_spans_ + sp + 1] = begin + count;
  }
  int64_t start(int64_t r, int64_t sp) const {
    return start_[r * num_spans_ + sp];
  }
  const int32_t* pos() const { return pos_.get(); }
  const float* val() const { return val_.get(); }

 private:
  // Room for `capacity` entries, keeping the first `used`.
  void Grow(int64_t capacity, int64_t used) {
    std::unique_ptr<int32_t[]> pos(new int32_t[capacity]);
    std::unique_ptr<float[]> val(new float[capacity]);
    if (used > 0) {
      std::copy(pos_.get(), pos_.get() + used, pos.get());
      std::copy(val_.get(), val_.get() + used, val.get());
    }
    pos_ = std::move(pos);
    val_ = std::move(val);
    capacity_ = capacity;
  }
  int64_t num_spans_;
  std::vector<int64_t> start_;
  std::unique_ptr<int32_t[]> pos_;
  std::unique_ptr<float[]> val_;
  int64_t capacity_ = 0;
};

// Both gradients or either one (a null output is not computed) from a
// sparse signal, in two sharded passes:
//  1. collect: the instances are cut into `collectors` ranges; each reads
//     its instances' backward rows front to back (a sequential read: the
//     signal is the largest operand) and keeps their non-zero entries
//     (SignalEntries), indexed by span of labels (SpanLabels);
//  2. apply: the spans are cut into `parts` contiguous ranges.  For a span,
//     its indices are range-checked (a bad one stops the part and fails the
//     op, naming the smallest bad position of all parts), its rows of
//     grad_weights zeroed, and then every instance's entries in the span
//     applied (cpu_loops::SparseRow), instances in order: each adds
//     g * features[i, indices[j, :]] to grad_weights[j, :] and
//     g * weights[j, :] to row i of the part's [batch, num_features]
//     features-gradient buffer at columns indices[j, :].  The span's rows
//     stay in L2, and an instance's features and buffer rows in L1 while
//     its entries of the span are applied.  The buffers are summed into
//     grad_features at the end (SumChunks).
// A zero entry contributes exactly 0 and nothing of its label is read
// (Sec. 3.3).
template <typename T>
void GradientsBySignalRows(OpKernelContext* ctx, const T* back, const T* feat,
                           const int32_t* idx, const T* weights,
                           const UniformSparseDims& d, double density,
                           T* grad_features, T* grad_weights, int64_t parts) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t threads = std::max(1, workers->num_threads);
  const int64_t span = SpanLabels(d.fan_in);
  const int64_t num_spans = (d.num_labels + span - 1) / span;
  const bool features_grad = grad_features != nullptr;
  const bool weights_grad = grad_weights != nullptr;
  const int64_t row_size = d.batch * d.num_features;
  const Isa isa = CpuIsa();

  // 1. Collect.
  const int64_t collectors =
      std::max<int64_t>(1, std::min<int64_t>(threads, d.batch));
  std::vector<std::optional<SignalEntries>> entries(collectors);
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, collectors,
      (d.batch + collectors - 1) / collectors * d.num_labels,
      [&](int64_t start, int64_t limit) {
        std::vector<float> sig_storage;
        for (int64_t c = start; c < limit; ++c) {
          const int64_t i0 = d.batch * c / collectors;
          const int64_t i1 = d.batch * (c + 1) / collectors;
          // Reserved for the estimated density (it grows when needed).
          const int64_t expected = static_cast<int64_t>(
              density * 1.25 * static_cast<double>((i1 - i0) * d.num_labels));
          SignalEntries& list = entries[c].emplace(i1 - i0, num_spans,
                                                   expected + span + 16);
          for (int64_t i = i0; i < i1; ++i) {
            const T* row = back + i * d.num_labels;
            for (int64_t sp = 0; sp < num_spans; ++sp) {
              const int64_t j0 = sp * span;
              const int64_t n = std::min(span, d.num_labels - j0);
              list.Add(isa, i - i0, sp, AsFloat(row + j0, n, &sig_storage), n);
            }
          }
        }
      });

  // 2. Apply.
  std::vector<float> feat_storage, w_storage;
  const float* featf =
      weights_grad ? AsFloat(feat, row_size, &feat_storage) : nullptr;
  const float* w = features_grad
                       ? AsFloat(weights, d.num_labels * d.fan_in, &w_storage)
                       : nullptr;
  Tensor buffer_t;
  float* buffer = nullptr;
  if (features_grad) {
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({parts, row_size}),
                                           &buffer_t));
    buffer = buffer_t.flat<float>().data();
  } else {
    parts = std::max<int64_t>(1, num_spans);
  }
  FirstBad bad;
  const int64_t cost =
      (num_spans + parts - 1) / parts * span *
      (1 + static_cast<int64_t>(density * d.batch) * 4 * d.fan_in);
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, parts, cost,
      [&](int64_t start, int64_t limit) {
        std::vector<float> gw_storage;
        std::vector<uint8_t> read(span);
        if (weights_grad && !std::is_same<T, float>::value) {
          gw_storage.resize(span * d.fan_in);
        }
        for (int64_t unit = start; unit < limit; ++unit) {
          float* rows = nullptr;
          if (features_grad) {
            rows = buffer + unit * row_size;
            std::fill(rows, rows + row_size, 0.0f);
          }
          const int64_t s0 = num_spans * unit / parts;
          const int64_t s1 = num_spans * (unit + 1) / parts;
          for (int64_t sp = s0; sp < s1; ++sp) {
            const int64_t j0 = sp * span;
            const int64_t n = std::min(span, d.num_labels - j0);
            const int32_t* ij = idx + j0 * d.fan_in;
            // The span's labels that some entry reads, and their indices
            // checked (nothing else of the span is read).
            std::fill(read.begin(), read.begin() + n, 0);
            for (int64_t c = 0; c < collectors; ++c) {
              const SignalEntries& list = *entries[c];
              const int64_t rows = d.batch * (c + 1) / collectors -
                                   d.batch * c / collectors;
              const int32_t* pos = list.pos();
              for (int64_t r = 0; r < rows; ++r) {
                const int64_t q1 = list.start(r, sp + 1);
                for (int64_t q = list.start(r, sp); q < q1; ++q) {
                  read[pos[q]] = 1;
                }
              }
            }
            int64_t first = -1;
            for (int64_t t = 0; t < n && first < 0; ++t) {
              if (!read[t]) continue;
              const int64_t k = FirstOutOfRangeSerial(
                  ij + t * d.fan_in, d.fan_in, 0, d.num_features);
              if (k >= 0) first = t * d.fan_in + k;
            }
            if (first >= 0) {
              bad.Record(j0 * d.fan_in + first);
              break;  // every later position of this part is larger
            }
            const float* wj = w != nullptr ? w + j0 * d.fan_in : nullptr;
            // The span's weights, read at random by its entries next.
            if (wj != nullptr) PrefetchBytes(wj, n * d.fan_in * sizeof(float));
            float* gw = nullptr;
            if (weights_grad) {
              gw = std::is_same<T, float>::value
                       ? reinterpret_cast<float*>(grad_weights +
                                                  j0 * d.fan_in)
                       : gw_storage.data();
              std::fill(gw, gw + n * d.fan_in, 0.0f);
            }
            for (int64_t c = 0; c < collectors; ++c) {
              const SignalEntries& list = *entries[c];
              const int64_t i0 = d.batch * c / collectors;
              const int64_t i1 = d.batch * (c + 1) / collectors;
              for (int64_t i = i0; i < i1; ++i) {
                const int64_t q0 = list.start(i - i0, sp);
                const int64_t q1 = list.start(i - i0, sp + 1);
                if (q0 == q1) continue;
                cpu_loops::SparseRow(
                    isa, list.pos() + q0, list.val() + q0, q1 - q0, ij, wj,
                    d.fan_in,
                    featf != nullptr ? featf + i * d.num_features : nullptr,
                    gw, rows != nullptr ? rows + i * d.num_features : nullptr);
              }
            }
            if (weights_grad && !std::is_same<T, float>::value) {
              T* out = grad_weights + j0 * d.fan_in;
              for (int64_t q = 0; q < n * d.fan_in; ++q) {
                out[q] = static_cast<T>(gw[q]);
              }
            }
          }
        }
      });
  if (bad.found()) return FailIndex(ctx, idx, d, bad.get());
  if (features_grad) SumChunks(ctx, buffer, parts, row_size, grad_features);
}

// Both gradients or either one (a null output is not computed).  A sparse
// signal (estimated) goes instance-major (GradientsBySignalRows) when its
// per-thread buffers fit in kMaxScatterBytes.  Otherwise one pass over the
// signal: labels in blocks of kSignalBlock (TileSignal), each
// label's work skipped when its column is zero and proportional to its
// non-zeros otherwise (Sec. 3.3).  The features gradient is scattered into
// per-thread gT [num_features, bp] buffers (the transpose of the forward),
// which are then summed into grad_features; when that is not worth it or
// the buffers are too large, it is computed by instance rows instead
// (GradFeaturesByRows) and the pass computes the weights gradient only.
template <typename T>
void GradientsCpu(OpKernelContext* ctx, const T* back, const T* feat,
                  const int32_t* idx, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t threads = std::max(1, workers->num_threads);
  const int64_t bp = PaddedBatch(d.batch);
  const int64_t num_blocks = (d.num_labels + kSignalBlock - 1) / kSignalBlock;
  const double density = EstimateDensity(back, d.batch * d.num_labels);
  const bool dense_signal = DenseSignal(density, d.batch, bp);
  if (SparseSignal(density, d.batch, bp) && d.num_labels > 0) {
    // A sparse signal: instance-major, when the per-unit features-gradient
    // buffers fit.
    const int64_t spans =
        (d.num_labels + SpanLabels(d.fan_in) - 1) / SpanLabels(d.fan_in);
    const int64_t p = std::max<int64_t>(1, std::min(threads, spans));
    if (grad_features == nullptr ||
        static_cast<double>(p) * d.batch * d.num_features * 4 <=
            static_cast<double>(kMaxScatterBytes)) {
      GradientsBySignalRows(ctx, back, feat, idx, weights, d, density,
                            grad_features, grad_weights, p);
      return;
    }
  }
  // The features gradient: in the pass (scattered into per-part buffers),
  // by rows, or nothing to do.
  int64_t parts = 0;
  if (grad_features != nullptr && d.batch * d.num_features > 0) {
    const int64_t p = std::max<int64_t>(1, std::min(threads, num_blocks));
    if (density * d.batch >= kDenseColumnEntries && d.num_labels > 0 &&
        static_cast<double>(p) * d.num_features * bp * 4 <=
            static_cast<double>(kMaxScatterBytes)) {
      parts = p;
    } else {
      GradFeaturesByRows(ctx, back, idx, weights, d, grad_features);
      if (!ctx->status().ok()) return;
    }
  }
  const bool weights_grad = grad_weights != nullptr && d.fan_in > 0;
  if (parts == 0 && !weights_grad) {
    // Nothing to compute (no features, or fan_in 0), but a label with signal
    // is still read: with no features each of its indices is out of range.
    if (d.num_features == 0 && d.fan_in > 0) {
      int64_t first = d.num_labels;  // the smallest label with signal
      for (int64_t i = 0; i < d.batch; ++i) {
        const T* row = back + i * d.num_labels;
        for (int64_t j = 0; j < first; ++j) {
          if (static_cast<float>(row[j]) != 0.0f) first = j;
        }
      }
      if (first < d.num_labels) return FailIndex(ctx, idx, d, first * d.fan_in);
    }
    return;
  }
  if (num_blocks == 0) return;

  // featT for the weights gradient's dense columns.
  Tensor featT_t;
  float* featT = nullptr;
  if (weights_grad && dense_signal && d.batch > 0) {
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({d.num_features, bp}),
                                           &featT_t));
    featT = featT_t.flat<float>().data();
    TransposeFeatures(ctx, feat, d.batch, d.num_features, bp, featT);
  }
  std::vector<float> w_storage;
  const float* w =
      parts > 0 ? AsFloat(weights, d.num_labels * d.fan_in, &w_storage)
                : nullptr;
  Tensor gT_t;
  float* gT_all = nullptr;
  const int64_t slice = d.num_features * bp;
  if (parts > 0) {
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({parts, d.num_features, bp}), &gT_t));
    gT_all = gT_t.flat<float>().data();
  }
  const LabelGradients<T> label{d, feat, featT, w, bp, CpuIsa()};

  // Work units: with the features gradient one per part (a contiguous range
  // of blocks and its own gT buffer), else one per block.
  const int64_t units = parts > 0 ? parts : num_blocks;
  const int64_t blocks_per_unit = (num_blocks + units - 1) / units;
  const int64_t cost = blocks_per_unit * kSignalBlock *
                       (d.batch + static_cast<int64_t>(density * d.batch) *
                                      d.fan_in * 4);
  FirstBad bad;
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, units, cost,
      [&](int64_t start, int64_t limit) {
        TileSignal<T> signal(d.batch, bp, dense_signal);
        std::vector<float> sums(d.fan_in);
        for (int64_t unit = start; unit < limit; ++unit) {
          bool stop = false;  // a bad index: the rest of the unit is larger
          float* gT = nullptr;
          if (parts > 0) {
            gT = gT_all + unit * slice;
            std::fill(gT, gT + slice, 0.0f);
          }
          const int64_t b0 = parts > 0 ? num_blocks * unit / parts : unit;
          const int64_t b1 =
              parts > 0 ? num_blocks * (unit + 1) / parts : unit + 1;
          for (int64_t block = b0; block < b1 && !stop; ++block) {
            const int64_t j0 = block * kSignalBlock;
            const int64_t nt = std::min(kSignalBlock, d.num_labels - j0);
            signal.Load(back, d.num_labels, j0, nt);
            for (int64_t t = 0; t < nt; ++t) {
              const int64_t j = j0 + t;
              const int64_t n = signal.count(t);
              T* gj = weights_grad ? grad_weights + j * d.fan_in : nullptr;
              if (n == 0) {  // no signal: indices[j, :] is not read
                if (gj != nullptr) {
                  std::fill(gj, gj + d.fan_in, static_cast<T>(0.0f));
                }
                continue;
              }
              const int32_t* ij = idx + j * d.fan_in;
              const int64_t k =
                  FirstOutOfRangeSerial(ij, d.fan_in, 0, d.num_features);
              if (k >= 0) {
                bad.Record(j * d.fan_in + k);
                stop = true;
                break;
              }
              if (gj != nullptr) label.Weights(&signal, t, n, ij, sums.data(), gj);
              if (gT != nullptr) {
                label.Features(&signal, t, n, ij, w + j * d.fan_in, gT);
              }
            }
          }
        }
      });
  if (bad.found()) return FailIndex(ctx, idx, d, bad.get());
  if (parts == 0) return;
  // grad_features[i, f] = sum over parts of gT[part, f, i]: the parts are
  // summed into the first (in place), which is then transposed in blocks
  // of features.
  SumChunks(ctx, gT_all, parts, slice, gT_all);
  constexpr int64_t kBlock = 64;
  const int64_t feature_blocks = (d.num_features + kBlock - 1) / kBlock;
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, feature_blocks, kBlock * bp * 2,
      [&](int64_t start, int64_t limit) {
        for (int64_t blk = start; blk < limit; ++blk) {
          const int64_t f0 = blk * kBlock;
          const int64_t f1 = std::min(d.num_features, f0 + kBlock);
          for (int64_t i = 0; i < d.batch; ++i) {
            T* row = grad_features + i * d.num_features;
            for (int64_t f = f0; f < f1; ++f) {
              row[f] = static_cast<T>(gT_all[f * bp + i]);
            }
          }
        }
      });
}

}  // namespace

// ---------------------------------------------------------------------------
// CPU functors.

namespace functor {

template <typename T>
struct UniformSparseMatmul<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* scores) const {
    ForwardCpu(ctx, features, indices, weights, d, scores);
  }
};

template <typename T>
struct UniformSparseMatmulGradFeatures<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features) const {
    GradientsCpu<T>(ctx, backward, nullptr, indices, weights, d, grad_features,
                    nullptr);
  }
};

template <typename T>
struct UniformSparseMatmulGradWeights<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const UniformSparseDims& d,
                  T* grad_weights) const {
    GradientsCpu<T>(ctx, backward, features, indices, nullptr, d, nullptr,
                    grad_weights);
  }
};

template <typename T>
struct UniformSparseMatmulGrad<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) const {
    GradientsCpu<T>(ctx, backward, features, indices, weights, d,
                    grad_features, grad_weights);
  }
};

// ---------------------------------------------------------------------------
// GPU functors: framework-free CUDA launchers (uniform_sparse_kernels.cu.cc)
// called on TensorFlow's stream with a workspace from TensorFlow's allocator;
// they range-check indices on the device.  float, half and bfloat16 (float
// accumulation).

#if XMC_TF_WITH_CUDA

namespace {

// The launchers of one value type (F32 / F16 / BF16); Bits is the pointer
// type they take (float, or the uint16_t bits of Eigen::half / bfloat16).
template <typename T>
struct GpuLaunchers;

#define XMC_US_GPU_LAUNCHERS(T, BITS, SUFFIX)                     \
  template <>                                                     \
  struct GpuLaunchers<T> {                                        \
    using Bits = BITS;                                            \
    static constexpr auto forward = XmcUniformSparseForwardGpu##SUFFIX;  \
    static constexpr auto grad_features =                         \
        XmcUniformSparseGradFeaturesGpu##SUFFIX;                  \
    static constexpr auto grad_weights =                          \
        XmcUniformSparseGradWeightsGpu##SUFFIX;                   \
    static constexpr auto grad = XmcUniformSparseGradGpu##SUFFIX; \
  };
XMC_US_GPU_LAUNCHERS(float, float, F32)
XMC_US_GPU_LAUNCHERS(Eigen::half, uint16_t, F16)
XMC_US_GPU_LAUNCHERS(Eigen::bfloat16, uint16_t, BF16)
#undef XMC_US_GPU_LAUNCHERS

// A T pointer as the launchers' pointer type (same bits).
template <typename T>
auto Bits(const T* p) {
  return reinterpret_cast<const typename GpuLaunchers<T>::Bits*>(p);
}
template <typename T>
auto Bits(T* p) {
  return reinterpret_cast<typename GpuLaunchers<T>::Bits*>(p);
}

// Calls launcher(operands..., batch, num_features, num_labels, fan_in,
// workspace, error_scratch, bad_position, stream) (the launchers' common
// signature) with a workspace of the size the launcher asks for (`kind`:
// 0 forward, 1 grad features, 2 grad weights, 3 both), and fails the op on
// an allocation failure, a CUDA error or an out-of-range index.
template <typename T, typename Launcher, typename... Operands>
void RunUniformSparseGpu(OpKernelContext* ctx, const UniformSparseDims& d,
                         int kind, Launcher launcher, Operands... operands) {
  const int64_t bytes = XmcUniformSparseGpuWorkspaceBytes(
      kind, sizeof(T), d.batch, d.num_features, d.num_labels, d.fan_in);
  OP_REQUIRES(ctx, bytes >= 0,
              errors::Internal("xmc_tf: bad uniform-sparse workspace query"));
  Tensor workspace;
  OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT8,
                                         TensorShape({std::max<int64_t>(
                                             bytes, 1)}),
                                         &workspace));
  void* workspace_ptr = workspace.flat<int8_t>().data();
  const auto launch = [&](int64_t* scratch, int64_t* bad_position,
                          void* stream) {
    return launcher(operands..., d.batch, d.num_features, d.num_labels,
                    d.fan_in, workspace_ptr, scratch, bad_position, stream);
  };
  int64_t bad = -1;
  OP_REQUIRES_OK(ctx, RunCheckedLauncher(ctx, "a uniform-sparse kernel", 1,
                                         &bad, launch));
  if (bad >= 0) {  // the index values live on the device: name the position
    ctx->CtxFailure(OutOfRange("indices",
                               TensorShape({d.num_labels, d.fan_in}), bad,
                               std::nullopt, 0, d.num_features,
                               "num_features"));
  }
}

}  // namespace

template <typename T>
struct UniformSparseMatmul<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* scores) const {
    RunUniformSparseGpu<T>(ctx, d, 0, GpuLaunchers<T>::forward,
                           Bits(features), indices, Bits(weights),
                           Bits(scores));
  }
};

template <typename T>
struct UniformSparseMatmulGradFeatures<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features) const {
    RunUniformSparseGpu<T>(ctx, d, 1, GpuLaunchers<T>::grad_features,
                           Bits(backward), indices, Bits(weights),
                           Bits(grad_features));
  }
};

template <typename T>
struct UniformSparseMatmulGradWeights<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const UniformSparseDims& d,
                  T* grad_weights) const {
    RunUniformSparseGpu<T>(ctx, d, 2, GpuLaunchers<T>::grad_weights,
                           Bits(backward), Bits(features), indices,
                           Bits(grad_weights));
  }
};

template <typename T>
struct UniformSparseMatmulGrad<GpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* backward, const T* features,
                  const int32_t* indices, const T* weights,
                  const UniformSparseDims& d, T* grad_features,
                  T* grad_weights) const {
    RunUniformSparseGpu<T>(ctx, d, 3, GpuLaunchers<T>::grad, Bits(backward),
                           Bits(features), indices, Bits(weights),
                           Bits(grad_features), Bits(grad_weights));
  }
};

#endif  // XMC_TF_WITH_CUDA

}  // namespace functor

// ---------------------------------------------------------------------------
// The op kernels: one class per op, templated on the device and dtype; each
// validates ranks and shapes, allocates its outputs and calls its functor.

namespace {

template <typename T>
const T* Data(const Tensor& t) {
  return t.flat<T>().data();
}
template <typename T>
T* Data(Tensor* t) {
  return t->flat<T>().data();
}

// The operands of the gradient ops: backward, features, indices (inputs 0-2)
// and, `with_weights`, weights (input 3).
struct GradientOperands {
  GradientOperands(OpKernelContext* ctx, bool with_weights)
      : backward(ctx->input(0)),
        features(ctx->input(1)),
        indices(ctx->input(2)),
        weights(with_weights ? &ctx->input(3) : nullptr) {}
  Status Validate(UniformSparseDims* d) const {
    return ValidateShapes(&features, indices, weights, &backward, d);
  }
  const Tensor& backward;
  const Tensor& features;
  const Tensor& indices;
  const Tensor* weights;  // nullptr without weights
};

template <typename Device, typename T>
class UniformSparseMatmulOp : public OpKernel {
 public:
  explicit UniformSparseMatmulOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& features = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx,
                   ValidateShapes(&features, indices, &weights, nullptr, &d));
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({d.batch, d.num_labels}), &scores));
    functor::UniformSparseMatmul<Device, T>()(
        ctx, Data<T>(features), Data<int32_t>(indices), Data<T>(weights), d,
        Data<T>(scores));
  }
};

template <typename Device, typename T>
class UniformSparseMatmulGradFeaturesOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradFeaturesOp(OpKernelConstruction* c)
      : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const GradientOperands in(ctx, /*with_weights=*/true);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx, in.Validate(&d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.features.shape(), &grad));
    functor::UniformSparseMatmulGradFeatures<Device, T>()(
        ctx, Data<T>(in.backward), Data<int32_t>(in.indices),
        Data<T>(*in.weights), d, Data<T>(grad));
  }
};

template <typename Device, typename T>
class UniformSparseMatmulGradWeightsOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradWeightsOp(OpKernelConstruction* c)
      : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const GradientOperands in(ctx, /*with_weights=*/false);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx, in.Validate(&d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.indices.shape(), &grad));
    functor::UniformSparseMatmulGradWeights<Device, T>()(
        ctx, Data<T>(in.backward), Data<T>(in.features),
        Data<int32_t>(in.indices), d, Data<T>(grad));
  }
};

template <typename Device, typename T>
class UniformSparseMatmulGradOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const GradientOperands in(ctx, /*with_weights=*/true);
    UniformSparseDims d;
    OP_REQUIRES_OK(ctx, in.Validate(&d));
    Tensor* grad_features = nullptr;
    Tensor* grad_weights = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, in.features.shape(), &grad_features));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, in.indices.shape(), &grad_weights));
    functor::UniformSparseMatmulGrad<Device, T>()(
        ctx, Data<T>(in.backward), Data<T>(in.features),
        Data<int32_t>(in.indices), Data<T>(*in.weights), d,
        Data<T>(grad_features), Data<T>(grad_weights));
  }
};

#define REGISTER(DEVICE_NAME, Dev, T)                                        \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("Xmc>UniformSparseMatmul").Device(DEVICE_NAME).TypeConstraint<T>( \
          "T"),                                                              \
      UniformSparseMatmulOp<Dev, T>);                                        \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradFeatures")        \
                              .Device(DEVICE_NAME)                           \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradFeaturesOp<Dev, T>);        \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradWeights")         \
                              .Device(DEVICE_NAME)                           \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradWeightsOp<Dev, T>);         \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGrad")                \
                              .Device(DEVICE_NAME)                           \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradOp<Dev, T>);

REGISTER(DEVICE_CPU, CpuDevice, float);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::half);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::bfloat16);
#if XMC_TF_WITH_CUDA
REGISTER(DEVICE_GPU, GpuDevice, float);
REGISTER(DEVICE_GPU, GpuDevice, Eigen::half);
REGISTER(DEVICE_GPU, GpuDevice, Eigen::bfloat16);
#endif
#undef REGISTER

}  // namespace
}  // namespace xmc_tf
