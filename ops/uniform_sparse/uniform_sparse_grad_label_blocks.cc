// The uniform-sparse gradients by label blocks (GradientsByLabelBlocks of
// uniform_sparse_grad_plan.h): the path of a denser signal.  One pass over
// the labels in blocks of kSignalBlock.  A block's signal
// backward[:, j0:j0+128] is loaded (TileSignal) as dense columns (as
// per-label lists of non-zeros for a sparse signal whose instance-major
// buffers would exceed kMaxScatterBytes).  Then per label: an all-zero
// column is skipped without reading indices or weights (grad_weights[j, :]
// = 0); a column with at least bp / kDenseColumnFactor non-zeros takes the
// vector loops (the dot products of the column with the featT rows of its
// connections, sixteen connections at a time, cpu_loops::GradWeightsDense;
// the scatter of weights[j, k] * column into row indices[j, k] of the
// thread's gT [num_features, bp] buffer, cpu_loops::GradFeaturesScatter);
// a sparser one costs one update per non-zero and connection.  The gT
// buffers are summed into grad_features at the end.  When the plan computes
// grad_features by instance rows instead (GradFeaturesByRows), the pass
// computes the weights gradient only.  A label's row of indices is
// range-checked where its non-zero signal first reads it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/sum_chunks.h"
#include "ops/uniform_sparse/uniform_sparse_cpu.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_common.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_loops.h"
#include "ops/uniform_sparse/uniform_sparse_grad_plan.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace uniform_sparse_cpu {

namespace {

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

// One label's share of both gradients, from its signal (count(t) = n > 0
// non-zeros).
template <typename T>
struct LabelGradients {
  const UniformSparseDims& d;
  const T* feat;       // features [batch, num_features]
  const float* featT;  // [num_features, bp] or nullptr
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

}  // namespace

// One pass over the signal: labels in blocks of kSignalBlock (TileSignal),
// each label's work skipped when its column is zero and proportional to its
// non-zeros otherwise (Sec. 3.3).  With plan.parts > 0 the features
// gradient is scattered into per-part gT [num_features, bp] buffers (the
// transpose of the forward), which are then summed into grad_features;
// else the pass computes the weights gradient only (plan.weights_grad).
template <typename T>
void GradientsByLabelBlocks(OpKernelContext* ctx, const T* back,
                            const T* feat, const int32_t* idx,
                            const T* weights, const UniformSparseDims& d,
                            const GradientPlan& plan, T* grad_features,
                            T* grad_weights) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t bp = plan.bp;
  const int64_t num_blocks = (d.num_labels + kSignalBlock - 1) / kSignalBlock;
  const double density = plan.density;
  const bool dense_signal = plan.dense_signal;
  const int64_t parts = plan.parts;
  const bool weights_grad = plan.weights_grad;

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
  Tensor gT_t;
  float* gT_all = nullptr;
  const int64_t slice = d.num_features * bp;
  if (parts > 0) {
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({parts, d.num_features, bp}), &gT_t));
    gT_all = gT_t.flat<float>().data();
  }
  const LabelGradients<T> label{d, feat, featT, bp, CpuIsa()};

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
        std::vector<float> w_row;
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
                // 16-bit weights widened a label at a time (float32 ones
                // read in place).
                label.Features(&signal, t, n, ij,
                               AsFloat(weights + j * d.fan_in, d.fan_in,
                                       &w_row),
                               gT);
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

#define XMC_US_INSTANTIATE(T)                                              \
  template void GradientsByLabelBlocks<T>(                                \
      OpKernelContext*, const T*, const T*, const int32_t*, const T*,     \
      const UniformSparseDims&, const GradientPlan&, T*, T*);
XMC_US_CPU_TYPES(XMC_US_INSTANTIATE)
#undef XMC_US_INSTANTIATE

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf
