// The uniform-sparse gradients from a sparse signal, instance-major
// (GradientsBySignalRows of uniform_sparse_grad_plan.h): the path of a
// signal with fewer than bp / kSparseSignalFactor non-zeros per label
// column on average (estimated).  The backward rows are read front to back
// once and their non-zero entries kept (SignalEntries, found and
// compressed a vector at a time by cpu_loops::NonZeros); then, per span of
// labels whose indices, weights and grad_weights rows fit in L2
// (SpanLabels), every instance's entries in the span add
// g * features[i, indices[j, :]] to grad_weights[j, :] (hardware gathers)
// and g * weights[j, :] to row i of the thread's [batch, num_features]
// features-gradient buffer, which stays in L1 while the instance's entries
// are applied (cpu_loops::SparseRow).  The work is proportional to the
// non-zeros (Sec. 3.3); a span's labels that some entry reads have their
// indices range-checked before the span is applied.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
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

}  // namespace

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
                           const UniformSparseDims& d,
                           const GradientPlan& plan, T* grad_features,
                           T* grad_weights) {
  const double density = plan.density;
  int64_t parts = plan.parts;
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
  std::vector<float> feat_storage;
  const float* featf =
      weights_grad ? AsFloat(feat, row_size, &feat_storage) : nullptr;
  // float32 weights are read in place; 16-bit ones are widened per span,
  // the rows its entries read only (never the whole [m, s] matrix).
  const float* w = features_grad && std::is_same<T, float>::value
                       ? reinterpret_cast<const float*>(weights)
                       : nullptr;
  const bool widen = features_grad && !std::is_same<T, float>::value;
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
        std::vector<float> gw_storage, w_span(widen ? span * d.fan_in : 0);
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
            if (widen) {
              const T* src = weights + j0 * d.fan_in;
              for (int64_t t = 0; t < n; ++t) {
                if (!read[t]) continue;
                for (int64_t k = 0; k < d.fan_in; ++k) {
                  w_span[t * d.fan_in + k] =
                      static_cast<float>(src[t * d.fan_in + k]);
                }
              }
              wj = w_span.data();
            }
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

#define XMC_US_INSTANTIATE(T)                                              \
  template void GradientsBySignalRows<T>(                                 \
      OpKernelContext*, const T*, const T*, const int32_t*, const T*,     \
      const UniformSparseDims&, const GradientPlan&, T*, T*);
XMC_US_CPU_TYPES(XMC_US_INSTANTIATE)
#undef XMC_US_INSTANTIATE

}  // namespace uniform_sparse_cpu
}  // namespace xmc_tf
