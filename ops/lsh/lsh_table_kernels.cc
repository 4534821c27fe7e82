// CPU kernels of the LSH table ops (Xmc>LshBuildTables, Xmc>LshUpdateTables)
// and their framework-free functors (BuildTable, UpdateTable,
// FirstNonPermutation, declared in lsh_kernels.h): L hash tables as CSR
// buckets, built by counting sort and updated in place of a rebuild.  See
// lsh_ops.cc for the op contracts and lsh_kernels.h for the layouts.
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
// (the update's input tables must be permutations).  Tables are spread over
// TensorFlow's intra-op thread pool.

#include <algorithm>
#include <atomic>
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

void BuildTable(const int32_t* codes, int64_t m, int64_t L, int64_t table,
                int64_t B, int32_t* offsets, int32_t* labels) {
  std::fill(offsets, offsets + B + 1, 0);
  for (int64_t j = 0; j < m; ++j) ++offsets[codes[j * L + table] + 1];
  for (int64_t c = 0; c < B; ++c) offsets[c + 1] += offsets[c];
  std::vector<int32_t> fill(offsets, offsets + B);
  for (int64_t j = 0; j < m; ++j) {
    labels[fill[codes[j * L + table]]++] = static_cast<int32_t>(j);
  }
}

bool UpdateTable(const int32_t* old_offsets, const int32_t* old_labels,
                 int64_t m, int64_t B, std::vector<Move>* moves,
                 int32_t* new_offsets, int32_t* new_labels) {
  // Net change of every bucket, then the new offsets.
  std::vector<int64_t> delta(B + 1, 0);
  for (const Move& mv : *moves) {
    --delta[mv.from];
    ++delta[mv.to];
  }
  int64_t shift = 0;
  new_offsets[0] = 0;
  for (int64_t c = 0; c < B; ++c) {
    shift += delta[c];
    new_offsets[c + 1] = static_cast<int32_t>(old_offsets[c + 1] + shift);
  }
  // Removals sorted by (bucket, label), insertions likewise.
  std::vector<std::pair<int32_t, int32_t>> removed, added;
  removed.reserve(moves->size());
  added.reserve(moves->size());
  for (const Move& mv : *moves) {
    removed.emplace_back(mv.from, mv.label);
    added.emplace_back(mv.to, mv.label);
  }
  std::sort(removed.begin(), removed.end());
  std::sort(added.begin(), added.end());
  // Touched buckets in increasing order; untouched runs are block copies.
  std::vector<int32_t> touched;
  touched.reserve(2 * moves->size());
  for (const auto& r : removed) touched.push_back(r.first);
  for (const auto& a : added) touched.push_back(a.first);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());

  int64_t copied_to = 0;  // old buckets [0, copied_to) are done
  size_t ri = 0, ai = 0;
  for (int32_t c : touched) {
    // Untouched buckets [copied_to, c): one contiguous block, shifted.
    const int64_t src = old_offsets[copied_to];
    const int64_t len = old_offsets[c] - src;
    if (len > 0) {
      std::memmove(new_labels + new_offsets[copied_to], old_labels + src,
                   len * sizeof(int32_t));
    }
    // Merge bucket c: old entries minus removals, plus insertions (all sorted).
    int32_t* out = new_labels + new_offsets[c];
    int32_t* const out_end = new_labels + new_offsets[c + 1];
    const int32_t* in = old_labels + old_offsets[c];
    const int32_t* in_end = old_labels + old_offsets[c + 1];
    while (true) {
      // Removals of this bucket below the current entry are absent from it
      // (inconsistent codes): skip them; the size check below catches it.
      while (in < in_end && ri < removed.size() && removed[ri].first == c &&
             removed[ri].second < *in) {
        ++ri;
      }
      if (in < in_end && ri < removed.size() && removed[ri].first == c &&
          removed[ri].second == *in) {
        ++in;
        ++ri;
        continue;
      }
      const bool has_in = in < in_end;
      const bool has_add = ai < added.size() && added[ai].first == c;
      if (!has_in && !has_add) break;
      if (out == out_end) return false;
      if (has_add && (!has_in || added[ai].second < *in)) {
        *out++ = added[ai++].second;
      } else {
        *out++ = *in++;
      }
    }
    if (out != out_end) return false;
    while (ri < removed.size() && removed[ri].first == c) ++ri;
    copied_to = c + 1;
  }
  const int64_t src = old_offsets[copied_to];
  const int64_t len = old_offsets[B] - src;
  if (len > 0) {
    std::memmove(new_labels + new_offsets[copied_to], old_labels + src,
                 len * sizeof(int32_t));
  }
  return true;
}

int64_t FirstNonPermutation(const int32_t* labels, int64_t m,
                            std::vector<uint64_t>* seen) {
  seen->assign(static_cast<size_t>(m / 64 + 1), 0);
  uint64_t* bits = seen->data();
  // Fast path, branch-free: every entry in [0, m) (the sign bit of
  // j | (hi - j) in uint32 is set exactly when j < 0 or j > hi = m - 1), then
  // every label marked; m entries covering m labels are a permutation.
  if (m > 0) {
    const uint32_t hi = static_cast<uint32_t>(m - 1);
    uint32_t acc = 0;
    for (int64_t t = 0; t < m; ++t) {
      const uint32_t j = static_cast<uint32_t>(labels[t]);
      acc |= j | (hi - j);
    }
    if (!(acc >> 31)) {
      for (int64_t t = 0; t < m; ++t) {
        const uint32_t j = static_cast<uint32_t>(labels[t]);
        bits[j >> 6] |= uint64_t{1} << (j & 63);
      }
      uint64_t all = ~uint64_t{0};
      for (int64_t w = 0; w < m / 64; ++w) all &= bits[w];
      if (m % 64 != 0) all &= bits[m / 64] | (~uint64_t{0} << (m % 64));
      if (all == ~uint64_t{0}) return -1;
      seen->assign(seen->size(), 0);
    }
  }
  // Slow path (an error): the first entry out of range or repeated.
  for (int64_t t = 0; t < m; ++t) {
    const uint32_t j = static_cast<uint32_t>(labels[t]);
    if (j >= static_cast<uint64_t>(m)) return t;  // negative or >= m
    const uint64_t bit = uint64_t{1} << (j & 63);
    if (bits[j >> 6] & bit) return t;
    bits[j >> 6] |= bit;
  }
  return -1;
}

}  // namespace lsh

// ---------------------------------------------------------------------------
// CPU functors (lsh_kernels.h): tables spread over TensorFlow's intra-op
// pool.
// ---------------------------------------------------------------------------

namespace {

using lsh::FirstCodeOutOfRange;
using lsh::NotInRange;

// Checks the CSR offsets [L, B + 1] of every table: 0 = first <= ... <= last
// = m.  O(L B).
absl::Status CheckOffsets(const int32_t* off, int64_t L, int64_t B1,
                          int64_t m) {
  for (int64_t l = 0; l < L; ++l) {
    const int32_t* o = off + l * B1;
    if (o[0] != 0 || o[B1 - 1] != m) {
      return errors::InvalidArgument(
          "offsets[", l, "] must start at 0 and end at num_labels = ", m,
          ", got ", o[0], " and ", o[B1 - 1]);
    }
    for (int64_t c = 0; c + 1 < B1; ++c) {
      if (o[c + 1] < o[c]) {
        return errors::InvalidArgument("offsets[", l, "] decreases at bucket ",
                                       c);
      }
    }
  }
  return absl::OkStatus();
}

// The error of table l whose labels [m] are not a permutation of [0, m).
absl::Status NonPermutationError(const int32_t* labels, int64_t L, int64_t m,
                                 int64_t l) {
  std::vector<uint64_t> seen;
  const int64_t t = lsh::FirstNonPermutation(labels + l * m, m, &seen);
  const int32_t v = labels[l * m + t];
  if (v < 0 || v >= m) {
    return NotInRange("labels", TensorShape({L, m}), l * m + t, v, 0, m,
                      "num_labels");
  }
  return errors::InvalidArgument(
      "labels[", l, ", ", t, "] = ", v, " repeats an earlier label id: "
      "labels[", l, "] must be a permutation of [0, ", m,
      ") (every label once per table, as Xmc>LshBuildTables builds them)");
}

}  // namespace

namespace functor {

template <>
struct LshBuildTables<CpuDevice> {
  void operator()(OpKernelContext* ctx, const int32_t* c, int64_t m,
                  int64_t L, int64_t B, int32_t* off, int32_t* lab) const {
    const int64_t bad = FirstOutOfRange(ctx, c, m * L, 0, B);
    if (bad >= 0) {
      ctx->CtxFailure(NotInRange("codes", TensorShape({m, L}), bad, c[bad], 0,
                                 B, "num_buckets"));
      return;
    }
    auto work = [&](int64_t start, int64_t limit) {
      for (int64_t l = start; l < limit; ++l) {
        lsh::BuildTable(c, m, L, l, B, off + l * (B + 1), lab + l * m);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, L,
                        10 * m + 2 * B, work);
  }
};

template <>
struct LshUpdateTables<CpuDevice> {
  void operator()(OpKernelContext* ctx, const lsh::Tables& t,
                  const int32_t* rw, const int32_t* rc, int64_t r,
                  int32_t* new_off, int32_t* new_lab, int32_t* nc) const {
    const int64_t L = t.L, B = t.B, m = t.m;
    const int32_t* old_off = t.offsets;
    const int32_t* old_lab = t.labels;
    const int32_t* old_codes = t.codes;
    OP_REQUIRES_OK(ctx, CheckOffsets(old_off, L, B + 1, m));
    const int64_t bad_row = FirstOutOfRange(ctx, rw, r, 0, m);
    if (bad_row >= 0) {
      ctx->CtxFailure(NotInRange("rows", TensorShape({r}), bad_row,
                                 rw[bad_row], 0, m, "num_labels"));
      return;
    }
    const int64_t bad_rc = FirstOutOfRange(ctx, rc, r * L, 0, B);
    if (bad_rc >= 0) {
      ctx->CtxFailure(NotInRange("row_codes", TensorShape({r, L}), bad_rc,
                                 rc[bad_rc], 0, B, "num_buckets"));
      return;
    }
    // Unique rows; the last occurrence of a repeated row wins.
    std::vector<std::pair<int32_t, int64_t>> order(r);
    for (int64_t i = 0; i < r; ++i) order[i] = {rw[i], i};
    std::sort(order.begin(), order.end());
    std::vector<std::pair<int32_t, int64_t>> unique;  // (label, source row)
    for (int64_t i = 0; i < r; ++i) {
      if (i + 1 < r && order[i + 1].first == order[i].first) continue;
      unique.push_back(order[i]);
    }
    // The old codes of the moved labels name the buckets they leave.  (The
    // others are checked while they are copied to new_codes, below.)
    const TensorShape codes_shape({m, L});
    for (const auto& u : unique) {
      const int64_t j = u.first;
      const int64_t l = FirstCodeOutOfRange(old_codes + j * L, L, B);
      if (l >= 0) {
        ctx->CtxFailure(NotInRange("codes", codes_shape, j * L + l,
                                   old_codes[j * L + l], 0, B,
                                   "num_buckets"));
        return;
      }
    }
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    std::atomic<int64_t> bad_table{-1};
    FirstBad bad_labels;  // a table whose labels are not a permutation
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<lsh::Move> moves;
      std::vector<uint64_t> seen;
      for (int64_t l = start; l < limit; ++l) {
        // Each table holds every label once (Xmc>LshBuildTables): checked
        // here, O(m), since untouched runs are block-copied unread.
        if (lsh::FirstNonPermutation(old_lab + l * m, m, &seen) >= 0) {
          bad_labels.Record(l);
          continue;
        }
        moves.clear();
        for (const auto& u : unique) {
          const int32_t from = old_codes[static_cast<int64_t>(u.first) * L + l];
          const int32_t to = rc[u.second * L + l];
          if (from != to) moves.push_back({u.first, from, to});
        }
        const int32_t* o_off = old_off + l * (B + 1);
        const int32_t* o_lab = old_lab + l * m;
        if (moves.empty()) {
          std::memcpy(new_off + l * (B + 1), o_off, (B + 1) * sizeof(int32_t));
          std::memcpy(new_lab + l * m, o_lab, m * sizeof(int32_t));
          continue;
        }
        if (!lsh::UpdateTable(o_off, o_lab, m, B, &moves,
                              new_off + l * (B + 1), new_lab + l * m)) {
          bad_table.store(l);
        }
      }
    };
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, L,
        3 * m + 4 * B + 40 * static_cast<int64_t>(unique.size()), work);
    if (bad_labels.found()) {
      ctx->CtxFailure(NonPermutationError(old_lab, L, m, bad_labels.get()));
      return;
    }
    OP_REQUIRES(ctx, bad_table.load() < 0,
                errors::InvalidArgument(
                    "table ", bad_table.load(),
                    " does not match codes: a re-hashed label was not in the "
                    "bucket its old code names (rebuild the tables)"));
    // Codes: updated copy (nc may be old_codes itself, a forwarded input
    // buffer).  Every old code must be a bucket id: checked on the copy,
    // block by block while it is in cache (one vectorised pass).
    FirstBad bad_code_row;
    auto copy_codes = [&](int64_t start, int64_t limit) {
      constexpr int64_t kChunk = 8192;  // 32 KB: checked while in L1
      for (int64_t a = start * L; a < limit * L; a += kChunk) {
        const int64_t len = std::min(kChunk, limit * L - a);
        if (nc != old_codes) std::memcpy(nc + a, old_codes + a, len * 4);
        const int64_t bad = FirstCodeOutOfRange(nc + a, len, B);
        if (bad >= 0) {
          bad_code_row.Record((a + bad) / L);
          return;
        }
      }
    };
    ::tensorflow::Shard(workers->num_threads, workers->workers, m, 3 * L + 1,
                        copy_codes);
    if (bad_code_row.found()) {
      const int64_t j = bad_code_row.get();
      const int64_t l = FirstCodeOutOfRange(nc + j * L, L, B);
      ctx->CtxFailure(NotInRange("codes", codes_shape, j * L + l,
                                 nc[j * L + l], 0, B, "num_buckets"));
      return;
    }
    for (const auto& u : unique) {
      std::memcpy(nc + static_cast<int64_t>(u.first) * L, rc + u.second * L,
                  L * sizeof(int32_t));
    }
  }
};

}  // namespace functor

// ---------------------------------------------------------------------------
// TensorFlow kernels (one class per op, templated on the device): attribute,
// rank and shape checks, output allocation, then the functor.
// ---------------------------------------------------------------------------

namespace {

using lsh::CheckInt32Size;
using lsh::CheckTables;

template <typename Device>
class LshBuildTablesOp : public OpKernel {
 public:
  explicit LshBuildTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_buckets", &num_buckets_));
    // Before any B + 1: offsets are [L, B + 1].
    OP_REQUIRES(ctx, num_buckets_ >= 1 && num_buckets_ <= lsh::kMaxNumBuckets,
                errors::InvalidArgument(
                    "num_buckets must be in [1, 2^24] (bucket ids of at most "
                    "24 bits), got ", num_buckets_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckRank(codes, 2, "codes", "[num_labels, L]"));
    const int64_t m = codes.dim_size(0), L = codes.dim_size(1);
    const int64_t B = num_buckets_;
    OP_REQUIRES_OK(ctx, CheckInt32Size(m, "num_labels"));
    Tensor* offsets = nullptr;
    Tensor* labels = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({L, B + 1}), &offsets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({L, m}), &labels));
    functor::LshBuildTables<Device>()(ctx, codes.flat<int32_t>().data(), m, L,
                                      B, offsets->flat<int32_t>().data(),
                                      labels->flat<int32_t>().data());
  }

 private:
  int64_t num_buckets_ = 1;
};

template <typename Device>
class LshUpdateTablesOp : public OpKernel {
 public:
  explicit LshUpdateTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& offsets = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& codes = ctx->input(2);
    const Tensor& rows = ctx->input(3);
    const Tensor& row_codes = ctx->input(4);
    int64_t L, B, m;
    OP_REQUIRES_OK(ctx, CheckTables(offsets, labels, codes, &L, &B, &m));
    OP_REQUIRES_OK(ctx, CheckRank(rows, 1, "rows", "[r]"));
    OP_REQUIRES_OK(ctx, CheckRank(row_codes, 2, "row_codes", "[r, L]"));
    const int64_t r = rows.dim_size(0);
    OP_REQUIRES(ctx, row_codes.dim_size(0) == r && row_codes.dim_size(1) == L,
                errors::InvalidArgument(
                    "row_codes shape ", row_codes.shape().DebugString(),
                    " must be [r, L] = [", r, ", ", L, "]"));
    const lsh::Tables tables{offsets.flat<int32_t>().data(),
                             labels.flat<int32_t>().data(),
                             codes.flat<int32_t>().data(), m, L, B};
    Tensor* new_offsets = nullptr;
    Tensor* new_labels = nullptr;
    Tensor* new_codes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, offsets.shape(), &new_offsets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, labels.shape(), &new_labels));
    // In place when the codes buffer can be forwarded (the functor writes it
    // last).
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            {2}, 2, codes.shape(), &new_codes));
    functor::LshUpdateTables<Device>()(
        ctx, tables, rows.flat<int32_t>().data(),
        row_codes.flat<int32_t>().data(), r,
        new_offsets->flat<int32_t>().data(), new_labels->flat<int32_t>().data(),
        new_codes->flat<int32_t>().data());
  }
};

}  // namespace

// CPU only (see lsh_kernels.h).
REGISTER_KERNEL_BUILDER(Name("Xmc>LshBuildTables").Device(DEVICE_CPU),
                        LshBuildTablesOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Xmc>LshUpdateTables").Device(DEVICE_CPU),
                        LshUpdateTablesOp<CpuDevice>);

}  // namespace xmc_tf
