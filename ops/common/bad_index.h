// The thread-safe "first bad entry" search of the TensorFlow CPU kernels:
// every kernel range-checks its id tensors on the intra-op thread pool and
// reports the *smallest* bad flat position, so that its error message does
// not depend on the thread count or the schedule.  TensorFlow-side only (not
// for the *.cu.cc launchers; their device-side twin is RecordBad in
// ops/common/cuda_launch.h).
//
//   FirstBad bad;                        // kernels that find bad entries
//   ... bad.Record(p) from any thread    // while they work
//   if (bad.found()) ... bad.get() ...
//
//   // A separate sharded pass over n positions:
//   const int64_t p = FirstBadPosition(ctx, n, [&](int64_t p) { ... });
//   // Over an integer array, entries outside [lo, hi):
//   const int64_t p = FirstOutOfRange(ctx, ids, n, lo, hi);
//   // The same on the calling thread (a kernel that checks as it goes):
//   const int64_t p = FirstOutOfRangeSerial(ids, n, lo, hi);
// All return -1 when every position is fine.
#ifndef XMC_TF_OPS_COMMON_BAD_INDEX_H_
#define XMC_TF_OPS_COMMON_BAD_INDEX_H_

#include <atomic>
#include <cstdint>
#include <limits>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

// The smallest position recorded by any thread (an atomic minimum).
class FirstBad {
 public:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

  void Record(int64_t position) {
    int64_t cur = first_.load(std::memory_order_relaxed);
    while (position < cur && !first_.compare_exchange_weak(cur, position)) {
    }
  }
  // The smallest recorded position, kNone when none was.
  int64_t get() const { return first_.load(); }
  bool found() const { return get() != kNone; }

 private:
  std::atomic<int64_t> first_{kNone};
};

// The smallest p in [0, n) with bad(p), or -1.  Shards [0, n) over the
// kernel's CPU threads (`cost` cycles per position, for ::tensorflow::Shard);
// a shard stops at its first bad position (every later one is larger).
template <typename Pred>
int64_t FirstBadPosition(::tensorflow::OpKernelContext* ctx, int64_t n,
                         const Pred& bad, int64_t cost = 1) {
  if (n <= 0) return -1;
  FirstBad first;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, n, cost,
                      [&](int64_t start, int64_t limit) {
                        for (int64_t p = start; p < limit; ++p) {
                          if (bad(p)) {
                            first.Record(p);
                            return;
                          }
                        }
                      });
  return first.found() ? first.get() : -1;
}

// The smallest p in [0, n) with ids[p] outside [lo, hi), or -1, on the
// calling thread: for a kernel that checks its ids piece by piece as its
// work reaches them.  Blocks of kBlock ids are tested with a branch-free
// (vectorised) loop and a block is searched only when it holds a bad id:
// the common all-good case reads the ids at memory speed.
template <typename TI>
int64_t FirstOutOfRangeSerial(const TI* ids, int64_t n, int64_t lo,
                              int64_t hi) {
  if (n <= 0) return -1;
  if (hi <= lo) return 0;  // an empty range: every id is out of it
  constexpr int64_t kBlock = 256;
  // v in [lo, hi) <=> (v - lo) < (hi - lo) as unsigned 64-bit numbers.
  // (modular arithmetic: also right for ids far outside the range).
  const uint64_t ulo = static_cast<uint64_t>(lo);
  const uint64_t width = static_cast<uint64_t>(hi) - ulo;
  for (int64_t p0 = 0; p0 < n; p0 += kBlock) {
    const int64_t p1 = p0 + kBlock < n ? p0 + kBlock : n;
    bool bad = false;
    for (int64_t p = p0; p < p1; ++p) {
      bad |= static_cast<uint64_t>(static_cast<int64_t>(ids[p])) - ulo >=
             width;
    }
    if (!bad) continue;
    for (int64_t p = p0; p < p1; ++p) {
      if (static_cast<uint64_t>(static_cast<int64_t>(ids[p])) - ulo >= width) {
        return p;
      }
    }
  }
  return -1;
}

// The smallest p in [0, n) with ids[p] outside [lo, hi), or -1: the ids in
// pieces of kPiece sharded over the kernel's CPU threads, each piece tested
// by FirstOutOfRangeSerial.
template <typename TI>
int64_t FirstOutOfRange(::tensorflow::OpKernelContext* ctx, const TI* ids,
                        int64_t n, int64_t lo, int64_t hi) {
  if (n <= 0) return -1;
  if (hi <= lo) return 0;
  constexpr int64_t kPiece = 256;
  FirstBad first;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, (n + kPiece - 1) / kPiece,
      kPiece, [&](int64_t start, int64_t limit) {
        const int64_t p0 = start * kPiece;
        const int64_t p1 = limit * kPiece < n ? limit * kPiece : n;
        const int64_t bad = FirstOutOfRangeSerial(ids + p0, p1 - p0, lo, hi);
        if (bad >= 0) first.Record(p0 + bad);
      });
  return first.found() ? first.get() : -1;
}

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_BAD_INDEX_H_
