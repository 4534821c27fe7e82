// CPU kernels of the LSH sampling ops (Xmc>LshQuery: constant-time negative
// sampling from the tables; Xmc>LshSparseCosine: cosines between sparse
// rows) and the framework-free query functor (QueryRow, declared in
// lsh_kernels.h).  See lsh_ops.cc for the op contracts and lsh_kernels.h for
// the layouts.
//
// Source: "A Truly Constant-Time Distribution-Aware Negative Sampling" (LNS),
// Sec. 1.2-2.3, Algorithm 1; SimHash (Charikar 2002, LNS Appendix A.2); DWTA
// (Chen & Shrivastava, UAI 2018, LNS Appendix A.3).
//
// Every kernel validates ranks, shapes, dtypes (by registration), the
// attributes that size its outputs or scratch memory, the range of every
// index it dereferences and of every id or code it copies into its outputs,
// and fails with InvalidArgument naming the offending entry (the smallest
// bad row: ops/common/bad_index.h FirstBad); the shared checks are in
// lsh_kernel_util.h and ops/common/validation.h.
// Structure (ops/common/device.h): one OpKernel class per op, templated on
// the device, checks attributes, ranks and shapes and allocates the outputs;
// functor::X<Device> (lsh_kernels.h) checks the data it reads and does the
// work.  Only the CpuDevice functors exist (DEVICE_CPU registrations).
// The query checks what it reads, so that its cost stays independent of m.
// Rows are spread over TensorFlow's intra-op thread pool.
//
// Constant-time query: a row's cost is O(q L) to locate its q L buckets (the
// CSR offsets give every bucket's size without reading it), O(k log k) to draw
// and sort k distinct positions among the T entries of those buckets (Floyd's
// algorithm) and O(k) random reads of labels (prefetched), plus O(k q L)
// code comparisons when collision counts are requested.  None of it depends
// on the number of labels m (memory latency aside).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/validation.h"
#include "ops/lsh/lsh_kernel_util.h"
#include "ops/lsh/lsh_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace lsh {

namespace {

// Open-addressing set of non-negative int64 (-1 = empty slot).
struct Int64Set {
  std::vector<int64_t>* slots;
  uint64_t mask;
  Int64Set(std::vector<int64_t>* storage, int64_t capacity) : slots(storage) {
    uint64_t size = 16;
    while (size < static_cast<uint64_t>(2 * capacity)) size <<= 1;
    slots->assign(size, -1);
    mask = size - 1;
  }
  // Inserts x; returns false when it was already present.
  bool Insert(int64_t x) {
    uint64_t h = Mix64(static_cast<uint64_t>(x)) & mask;
    while (true) {
      const int64_t v = (*slots)[h];
      if (v == x) return false;
      if (v < 0) {
        (*slots)[h] = x;
        return true;
      }
      h = (h + 1) & mask;
    }
  }
};

}  // namespace

QueryStatus QueryRow(const Tables& t, const int32_t* query_codes, int64_t q,
                     int k, uint64_t row_key, bool count_collisions,
                     QueryScratch* scratch, int32_t* ids, bool* valid,
                     int32_t* collisions, float* rate, int64_t* probed) {
  const int64_t L = t.L, B = t.B, m = t.m;
  auto& starts = scratch->probe_start;
  auto& ends = scratch->probe_end;
  starts.clear();
  ends.clear();
  int64_t total = 0;
  for (int64_t p = 0; p < q * L; ++p) {
    const int32_t c = query_codes[p];
    if (c == -1) continue;
    if (c < 0 || c >= B) return QueryStatus::kBadQueryCode;
    const int64_t l = p % L;
    const int32_t* off = t.offsets + l * (B + 1);
    const int64_t a = off[c], b = off[c + 1];
    if (a < 0 || b < a || b > m) return QueryStatus::kCorruptTables;
    if (b > a) {
      starts.push_back(l * m + a);
      total += b - a;
      ends.push_back(total);
    }
  }
  *probed = total;

  // Positions in [0, total) of the entries to read.
  auto& positions = scratch->positions;
  positions.clear();
  if (total <= k) {
    for (int64_t i = 0; i < total; ++i) positions.push_back(i);
    *rate = 1.0f;
  } else {
    // Floyd's algorithm: k distinct positions, uniformly at random.
    SplitMix rng{row_key};
    Int64Set set(&scratch->set, k);
    for (int64_t j = total - k; j < total; ++j) {
      const int64_t x = static_cast<int64_t>(rng.Uniform(j + 1));
      positions.push_back(set.Insert(x) ? x : (set.Insert(j), j));
    }
    std::sort(positions.begin(), positions.end());
    *rate = static_cast<float>(static_cast<double>(k) /
                               static_cast<double>(total));
  }
  // Positions -> addresses in labels (positions are sorted: one pass).
  size_t probe = 0;
  for (int64_t& pos : positions) {
    while (ends[probe] <= pos) ++probe;
    const int64_t before = probe == 0 ? 0 : ends[probe - 1];
    pos = starts[probe] + (pos - before);
    __builtin_prefetch(t.labels + pos);
  }
  // Distinct labels in position order.
  auto& found = scratch->found;
  found.clear();
  {
    Int64Set seen(&scratch->set, static_cast<int64_t>(positions.size()));
    for (int64_t address : positions) {
      const int32_t label = t.labels[address];
      if (label < 0 || label >= m) return QueryStatus::kCorruptTables;
      if (seen.Insert(label)) found.push_back(label);
    }
  }
  const int n = static_cast<int>(found.size());
  for (int i = 0; i < k; ++i) {
    ids[i] = i < n ? found[i] : 0;
    valid[i] = i < n;
    collisions[i] = 0;
  }
  if (count_collisions) {
    // Prefetch every cache line of every candidate's codes row first, so
    // that the misses overlap instead of serialising (rows are L * 4 bytes).
    for (int i = 0; i < n; ++i) {
      const char* row = reinterpret_cast<const char*>(
          t.codes + static_cast<int64_t>(found[i]) * L);
      for (int64_t byte = 0; byte < L * 4; byte += 64) {
        __builtin_prefetch(row + byte);
      }
    }
    // The codes rows read must hold bucket ids: one branch-free pass per
    // row, O(k L) next to the O(k q L) counts (the sign bit of c | (hi - c)
    // in uint32 is set exactly when c < 0 or c > hi = B - 1).
    const uint32_t hi =
        static_cast<uint32_t>(std::min<int64_t>(B, int64_t{1} << 31) - 1);
    uint32_t acc = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t* row = t.codes + static_cast<int64_t>(found[i]) * L;
      for (int64_t l = 0; l < L; ++l) {
        const uint32_t c = static_cast<uint32_t>(row[l]);
        acc |= c | (hi - c);
      }
    }
    if (acc >> 31) return QueryStatus::kBadCode;
    for (int i = 0; i < n; ++i) {
      const int32_t* row = t.codes + static_cast<int64_t>(found[i]) * L;
      int32_t count = 0;
      for (int64_t qi = 0; qi < q; ++qi) {
        const int32_t* qc = query_codes + qi * L;
        for (int64_t l = 0; l < L; ++l) count += row[l] == qc[l];
      }
      collisions[i] = count;
    }
  }
  return QueryStatus::kOk;
}

}  // namespace lsh

// ---------------------------------------------------------------------------
// CPU functors (lsh_kernels.h): batch rows spread over TensorFlow's intra-op
// pool; each row checks what it reads, the smallest failing row is named.
// ---------------------------------------------------------------------------

namespace {

using lsh::FirstNonFinite;
using lsh::NotInRange;

// Euclidean norm of a canonical row, in float64.  The entries are float32
// values or float64 sums of at most s of them (|v| < s * 2^128), so the
// squares cannot overflow and need no scaling.
double Norm(const std::vector<std::pair<int32_t, double>>& row) {
  double sq = 0.0;
  for (const auto& c : row) sq += c.second * c.second;
  return std::sqrt(sq);
}

// Largest num_features whose scatter array (float64, per shard) is dense.
constexpr int64_t kCosineDenseMax = int64_t{1} << 22;

}  // namespace

namespace functor {

template <>
struct LshQuery<CpuDevice> {
  void operator()(OpKernelContext* ctx, const lsh::Tables& tables,
                  const int32_t* qc, int64_t b, int64_t q,
                  const lsh::QueryConfig& config, int64_t step,
                  const lsh::QueryOutputs& out) const {
    const int64_t L = tables.L, B = tables.B;
    const int k = config.k;
    FirstBad bad_code, corrupt, bad_label_code;
    auto work = [&](int64_t start, int64_t limit) {
      lsh::QueryScratch scratch;
      for (int64_t i = start; i < limit; ++i) {
        const lsh::QueryStatus status = lsh::QueryRow(
            tables, qc + i * q * L, q, k, lsh::RowKey(config.seed, step, i),
            config.count_collisions, &scratch, out.ids + i * k,
            out.valid + i * k, out.collisions + i * k, out.rate + i,
            out.probed + i);
        if (status == lsh::QueryStatus::kBadQueryCode) bad_code.Record(i);
        if (status == lsh::QueryStatus::kCorruptTables) corrupt.Record(i);
        if (status == lsh::QueryStatus::kBadCode) bad_label_code.Record(i);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = 10 * q * L + 60 * k +
                         (config.count_collisions ? 2 * k * q * L : 0);
    ::tensorflow::Shard(workers->num_threads, workers->workers, b, cost, work);
    if (bad_code.found()) {
      const int64_t i = bad_code.get();
      int64_t t = 0;
      for (; t < q * L; ++t) {
        const int32_t c = qc[i * q * L + t];
        if (c != -1 && (c < 0 || c >= B)) break;
      }
      ctx->CtxFailure(errors::InvalidArgument(
          EntryName("query_codes", TensorShape({b, q, L}), i * q * L + t),
          " = ", qc[i * q * L + t], " is not -1 (no probe) or in [0, ", B,
          ") (num_buckets)"));
      return;
    }
    OP_REQUIRES(ctx, !corrupt.found(),
                errors::InvalidArgument(
                    "the tables are corrupt (an offset or a label id out of "
                    "range) at batch row ",
                    corrupt.get(), "; rebuild them"));
    if (bad_label_code.found()) {
      // The candidates of that row were written before their codes were
      // read: find the first bad code among them.
      const int64_t i = bad_label_code.get();
      for (int64_t t = 0; t < k && out.valid[i * k + t]; ++t) {
        const int64_t j = out.ids[i * k + t];
        for (int64_t l = 0; l < L; ++l) {
          const int32_t c = tables.codes[j * L + l];
          if (c < 0 || c >= B) {
            ctx->CtxFailure(NotInRange(
                "codes", TensorShape({tables.m, L}), j * L + l, c, 0, B,
                absl::StrCat("num_buckets; read for the collision counts of "
                             "batch row ",
                             i)));
            return;
          }
        }
      }
      ctx->CtxFailure(errors::Internal("LshQuery: bad code not found"));
    }
  }
};

template <>
struct LshSparseCosine<CpuDevice> {
  void operator()(OpKernelContext* ctx, const int32_t* ai, const float* aw,
                  const int32_t* bi, const float* bw,
                  const lsh::CosineDims& dims, int64_t e, float* out) const {
    const int64_t batch = dims.batch, k = dims.k, sa = dims.sa;
    const int64_t n = dims.n, sb = dims.sb;
    // The b row being compared is scattered into an array indexed by
    // "slot": its coordinate when num_features is moderate (dense map), else
    // the coordinate's rank among the distinct coordinates of the instance's
    // k a rows (compact map: memory O(k s_a), never O(num_features)).
    const bool dense_map = e <= kCosineDenseMax;
    // Failing rows, as flat row numbers of a ([batch * k]) and b.
    FirstBad a_index, a_finite, b_index, b_finite;
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<double> scatter(dense_map ? e : 0, 0.0);  // 0 between rows
      std::vector<int32_t> coords;  // compact map: sorted distinct coordinates
      std::vector<std::vector<std::pair<int32_t, double>>> rows(k);
      std::vector<double> norm(k);
      std::vector<std::pair<int32_t, double>> query;
      std::vector<int64_t> slots;  // slots of the b row's scattered entries
      for (int64_t i = start; i < limit; ++i) {
        bool ok = true;
        for (int64_t j = 0; j < k && ok; ++j) {
          const int64_t r = i * k + j;
          if (lsh::CanonicalSparse(ai + r * sa, aw + r * sa, sa, e,
                                   &rows[j]) >= 0) {
            a_index.Record(r);
            ok = false;
          } else if (FirstNonFinite(aw + r * sa, sa) >= 0) {
            a_finite.Record(r);
            ok = false;
          }
          norm[j] = Norm(rows[j]);
        }
        if (!ok) continue;
        if (!dense_map) {
          coords.clear();
          for (const auto& row : rows) {
            for (const auto& c : row) coords.push_back(c.first);
          }
          std::sort(coords.begin(), coords.end());
          coords.erase(std::unique(coords.begin(), coords.end()),
                       coords.end());
          if (scatter.size() < coords.size()) scatter.resize(coords.size());
          for (auto& row : rows) {  // coordinates -> ranks (rows are sorted)
            auto lo = coords.begin();
            for (auto& c : row) {
              lo = std::lower_bound(lo, coords.end(), c.first);
              c.first = static_cast<int32_t>(lo - coords.begin());
            }
          }
        }
        for (int64_t p = 0; p < n; ++p) {
          const int64_t r = i * n + p;
          if (lsh::CanonicalSparse(bi + r * sb, bw + r * sb, sb, e, &query) >=
              0) {
            b_index.Record(r);
            break;
          }
          if (FirstNonFinite(bw + r * sb, sb) >= 0) {
            b_finite.Record(r);
            break;
          }
          const double qn = Norm(query);
          slots.clear();
          if (dense_map) {
            for (const auto& c : query) {
              scatter[c.first] = c.second;
              slots.push_back(c.first);
            }
          } else {
            auto lo = coords.begin();
            for (const auto& c : query) {
              lo = std::lower_bound(lo, coords.end(), c.first);
              if (lo == coords.end()) break;
              if (*lo != c.first) continue;  // in no a row: adds 0 to dots
              scatter[lo - coords.begin()] = c.second;
              slots.push_back(lo - coords.begin());
            }
          }
          float* o = out + i * k * n + p;
          for (int64_t j = 0; j < k; ++j) {
            double dot = 0.0;
            for (const auto& c : rows[j]) dot += scatter[c.first] * c.second;
            const double den = qn * norm[j];
            o[j * n] = den > 0.0 ? static_cast<float>(dot / den) : 0.0f;
          }
          for (int64_t slot : slots) scatter[slot] = 0.0;
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, batch,
                        20 * k * sa + 4 * n * (k * sa + sb) +
                            (dense_map ? e : 40 * k * sa),
                        work);
    const struct {
      const FirstBad& err;
      const int32_t* idx;
      const char* indices_name;
      const char* weights_name;
      int64_t rows;
      int64_t s;
      bool index;
    } checks[] = {{a_index, ai, "a_indices", "a_weights", k, sa, true},
                  {a_finite, ai, "a_indices", "a_weights", k, sa, false},
                  {b_index, bi, "b_indices", "b_weights", n, sb, true},
                  {b_finite, bi, "b_indices", "b_weights", n, sb, false}};
    for (const auto& c : checks) {
      if (!c.err.found()) continue;
      const int64_t r = c.err.get();
      if (!c.index) {
        ctx->CtxFailure(errors::InvalidArgument(
            c.weights_name, "[", r / c.rows, ", ", r % c.rows,
            "] contains a NaN or infinite value"));
        return;
      }
      const int32_t* idx = c.idx + r * c.s;
      int64_t t = 0;
      while (t < c.s && idx[t] >= 0 && idx[t] < e) ++t;
      ctx->CtxFailure(NotInRange(c.indices_name,
                                 TensorShape({batch, c.rows, c.s}),
                                 r * c.s + t, idx[t], 0, e, "num_features"));
      return;
    }
  }
};

}  // namespace functor

// ---------------------------------------------------------------------------
// TensorFlow kernels (one class per op, templated on the device): attribute,
// rank and shape checks, output allocation, then the functor.
// ---------------------------------------------------------------------------

namespace {

using lsh::CheckNumFeatures;
using lsh::CheckTables;

// ----- Query -----------------------------------------------------------------

template <typename Device>
class LshQueryOp : public OpKernel {
 public:
  explicit LshQueryOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t k;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_candidates", &k));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &config_.seed));
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr("count_collisions", &config_.count_collisions));
    OP_REQUIRES(ctx, k >= 1 && k <= (1 << 24),
                errors::InvalidArgument("num_candidates must be in [1, 2^24], "
                                        "got ", k));
    config_.k = static_cast<int>(k);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& offsets = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& codes = ctx->input(2);
    const Tensor& query_codes = ctx->input(3);
    const Tensor& step = ctx->input(4);  // host memory on every device
    int64_t L, B, m;
    OP_REQUIRES_OK(ctx, CheckTables(offsets, labels, codes, &L, &B, &m));
    OP_REQUIRES_OK(ctx,
                   CheckRank(query_codes, 3, "query_codes", "[batch, q, L]"));
    OP_REQUIRES(ctx, query_codes.dim_size(2) == L,
                errors::InvalidArgument(
                    "query_codes.shape[2] must equal L = ", L,
                    " (offsets.shape[0]), got query_codes shape ",
                    query_codes.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckScalar(step, "step"));
    const int64_t b = query_codes.dim_size(0), q = query_codes.dim_size(1);
    const int64_t k = config_.k;
    Tensor *ids = nullptr, *valid = nullptr, *collisions = nullptr,
           *rate = nullptr, *probed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b, k}), &ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b, k}), &valid));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, TensorShape({b, k}), &collisions));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({b}), &rate));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({b}), &probed));
    if (b == 0) return;
    const lsh::Tables tables{offsets.flat<int32_t>().data(),
                             labels.flat<int32_t>().data(),
                             codes.flat<int32_t>().data(), m, L, B};
    const lsh::QueryOutputs out{
        ids->flat<int32_t>().data(), valid->flat<bool>().data(),
        collisions->flat<int32_t>().data(), rate->flat<float>().data(),
        probed->flat<int64_t>().data()};
    functor::LshQuery<Device>()(ctx, tables,
                                query_codes.flat<int32_t>().data(), b, q,
                                config_, step.scalar<int64_t>()(), out);
  }

 private:
  lsh::QueryConfig config_;
};

// ----- Cosines between sparse rows ----------------------------------------------

// Validates a batch of sparse rows [b, r, s] (indices, weights).
absl::Status CheckSparseBatch(const Tensor& indices, const Tensor& weights,
                              const char* name) {
  TF_RETURN_IF_ERROR(CheckRank(indices, 3, name, "[batch, rows, s]"));
  if (weights.shape() != indices.shape()) {
    return errors::InvalidArgument(
        name, " weights shape ", weights.shape().DebugString(),
        " must equal its indices shape ", indices.shape().DebugString());
  }
  return absl::OkStatus();
}

template <typename Device>
class LshSparseCosineOp : public OpKernel {
 public:
  explicit LshSparseCosineOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_features", &num_features_));
    OP_REQUIRES_OK(ctx, CheckNumFeatures(num_features_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a_idx = ctx->input(0);
    const Tensor& a_w = ctx->input(1);
    const Tensor& b_idx = ctx->input(2);
    const Tensor& b_w = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckSparseBatch(a_idx, a_w, "a"));
    OP_REQUIRES_OK(ctx, CheckSparseBatch(b_idx, b_w, "b"));
    OP_REQUIRES(ctx, a_idx.dim_size(0) == b_idx.dim_size(0),
                errors::InvalidArgument(
                    "a and b must have the same batch size, got shapes ",
                    a_idx.shape().DebugString(), " and ",
                    b_idx.shape().DebugString()));
    lsh::CosineDims dims;
    dims.batch = a_idx.dim_size(0);
    dims.k = a_idx.dim_size(1);
    dims.sa = a_idx.dim_size(2);
    dims.n = b_idx.dim_size(1);
    dims.sb = b_idx.dim_size(2);
    Tensor* cos = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({dims.batch, dims.k, dims.n}),
                            &cos));
    if (dims.batch == 0 || dims.k == 0 || dims.n == 0) return;
    functor::LshSparseCosine<Device>()(
        ctx, a_idx.flat<int32_t>().data(), a_w.flat<float>().data(),
        b_idx.flat<int32_t>().data(), b_w.flat<float>().data(), dims,
        num_features_, cos->flat<float>().data());
  }

 private:
  int64_t num_features_ = 1;
};

}  // namespace

// CPU only (see lsh_kernels.h); a GPU registration of LshQueryOp keeps
// `step` in host memory (.HostMemory("step")).
REGISTER_KERNEL_BUILDER(Name("Xmc>LshQuery").Device(DEVICE_CPU),
                        LshQueryOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Xmc>LshSparseCosine").Device(DEVICE_CPU),
                        LshSparseCosineOp<CpuDevice>);

}  // namespace xmc_tf
