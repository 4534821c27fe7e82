// CPU kernel of Xmc>SetRewire (see uniform_sparse_ops.cc for the contract):
// one SET prune/regrow step of every label's connections, in place of the
// NumPy version of xmc_tf.callbacks.rewiring.rewire (per-row argpartition,
// sorts of the flattened connection keys and a binary search of every draw
// in them: 70-130x the memory-bandwidth limit at 670k labels).
//
// Per label: a selection of the num_moved smallest |weight| (integer keys:
// one pass with a sorted buffer for num_moved <= 16, else nth_element),
// then rejection draws against the sources to avoid, held in a
// per-thread bitmap of num_features bits (set for the row's sources and its
// draws, cleared after the row: O(fan_in) per label) when num_features <=
// kMaxBitmapBits, else found by a scan of the row.  The generator is
// SplitMix64 keyed by (seed, row) with Lemire's unbiased bounded draws, so
// the result does not depend on the sharding.
//
// The operands are checked first (ops/common/validation.h messages; the
// index range with the sharded first-bad search of ops/common/bad_index.h),
// failing with InvalidArgument.
//
// Source: Mocanu et al. (SET, Nature Communications 2018); Schultheis &
// Babbar, Sec. 2 and 4.1.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace {

constexpr int64_t kMaxBitmapBits = int64_t{1} << 24;  // 2 MiB per thread

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound), bound in [1, 2^32) (Lemire, "Fast random integer
// generation in an interval", 2019).
uint32_t Bounded(uint64_t* state, uint32_t bound) {
  uint64_t m = (SplitMix64(state) >> 32) * bound;
  uint32_t low = static_cast<uint32_t>(m);
  if (low < bound) {
    const uint32_t threshold = static_cast<uint32_t>(-bound) % bound;
    while (low < threshold) {
      m = (SplitMix64(state) >> 32) * bound;
      low = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

// Sort key of connection k with weight w: the bits of |w| (for a
// non-negative float the bit pattern orders like the value, and a NaN's
// is above +inf's), then the position (ties: lower k first).
inline uint64_t Key(float w, int32_t k) {
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof(bits));
  bits &= 0x7FFFFFFFu;  // |w|
  return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(k);
}

// The n smallest keys of row wj (s entries), their positions sorted into
// out[0:n].  n <= 16: one pass keeping a sorted buffer of n keys; else
// nth_element over all s keys.
template <typename T>
void SmallestPositions(const T* wj, int64_t s, int64_t n,
                       std::vector<uint64_t>* keys, int64_t* out) {
  if (n == 0) return;
  uint64_t* key = keys->data();
  if (n <= 16) {
    int64_t have = 0;
    for (int64_t k = 0; k < s; ++k) {
      const uint64_t x =
          Key(static_cast<float>(wj[k]), static_cast<int32_t>(k));
      if (have == n && x >= key[n - 1]) continue;
      int64_t q = have < n ? have++ : n - 1;
      while (q > 0 && key[q - 1] > x) {
        key[q] = key[q - 1];
        --q;
      }
      key[q] = x;
    }
  } else {
    for (int64_t k = 0; k < s; ++k) {
      key[k] = Key(static_cast<float>(wj[k]), static_cast<int32_t>(k));
    }
    std::nth_element(key, key + (n - 1), key + s);
  }
  for (int64_t q = 0; q < n; ++q) out[q] = static_cast<uint32_t>(key[q]);
  std::sort(out, out + n);
}

// T: the weights' dtype (float or bfloat16: |w| compared as float32, which
// holds every bfloat16 exactly, so the order is the same).
template <typename T>
class SetRewireOp : public OpKernel {
 public:
  explicit SetRewireOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_moved", &num_moved_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    const Tensor& weights = ctx->input(1);
    const Tensor& num_features_t = ctx->input(2);
    const Tensor& seed_t = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckMatrix(indices, "indices"));
    OP_REQUIRES_OK(ctx, CheckSameShape(weights, "weights", indices, "indices",
                                       "[num_labels, fan_in]"));
    int64_t e = 0;
    OP_REQUIRES_OK(ctx, NonNegativeScalar(num_features_t, "num_features", &e));
    OP_REQUIRES(ctx,
                TensorShapeUtils::IsVector(seed_t.shape()) &&
                    seed_t.NumElements() == 2,
                errors::InvalidArgument("seed must be a [2] vector, got shape ",
                                        seed_t.shape().DebugString()));
    const int64_t m = indices.dim_size(0), s = indices.dim_size(1);
    const int64_t n = num_moved_;
    OP_REQUIRES(ctx, n <= s,
                errors::InvalidArgument("num_moved = ", n,
                                        " must be <= fan_in = ", s));
    OP_REQUIRES(ctx, e >= s && e <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument(
                    "num_features = ", e, " must be in [fan_in = ", s,
                    ", 2^31): every label needs fan_in distinct sources"));
    const int32_t* idx = indices.flat<int32_t>().data();
    const T* w = weights.flat<T>().data();
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();

    // Range check (the first bad entry in row-major order).
    const int64_t bad = FirstOutOfRange(ctx, idx, m * s, 0, e);
    OP_REQUIRES(ctx, bad < 0,
                OutOfRange("indices", indices.shape(), bad, idx[bad], 0, e,
                           "num_features"));

    Tensor* new_t = nullptr;
    Tensor* pos_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, indices.shape(), &new_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m, n}), &pos_t));
    int32_t* out = new_t->flat<int32_t>().data();
    int64_t* pos = pos_t->flat<int64_t>().data();
    if (m == 0) return;
    const auto seed = seed_t.flat<int64_t>();
    const uint64_t key0 = static_cast<uint64_t>(seed(0));
    const uint64_t key1 = static_cast<uint64_t>(seed(1));
    // Avoid every current source when enough others exist, else only the
    // ones that stay (as xmc_tf.callbacks.rewiring.rewire).
    const bool avoid_all = e - s >= n;
    const bool bitmap = e <= kMaxBitmapBits;

    ::tensorflow::Shard(
        workers->num_threads, workers->workers, m, 20 * s + 60 * n + 20,
        [&](int64_t start, int64_t limit) {
          std::vector<uint64_t> bits(bitmap ? (e + 63) / 64 : 0, 0);
          std::vector<uint64_t> keys(s);
          std::vector<int32_t> avoid;  // scan mode: sources to avoid
          auto test = [&](int32_t f) {
            if (bitmap) return ((bits[f >> 6] >> (f & 63)) & 1) != 0;
            return std::find(avoid.begin(), avoid.end(), f) != avoid.end();
          };
          auto mark = [&](int32_t f) {
            if (bitmap) {
              bits[f >> 6] |= uint64_t{1} << (f & 63);
            } else {
              avoid.push_back(f);
            }
          };
          for (int64_t j = start; j < limit; ++j) {
            const int32_t* ij = idx + j * s;
            const T* wj = w + j * s;
            int32_t* oj = out + j * s;
            int64_t* pj = pos + j * n;
            std::copy(ij, ij + s, oj);
            if (n == 0) continue;
            SmallestPositions(wj, s, n, &keys, pj);
            if (avoid_all) {
              for (int64_t k = 0; k < s; ++k) mark(ij[k]);
            } else {
              // Only the kept sources: positions pj are sorted.
              int64_t q = 0;
              for (int64_t k = 0; k < s; ++k) {
                if (q < n && pj[q] == k) {
                  ++q;
                  continue;
                }
                mark(ij[k]);
              }
            }
            uint64_t state = key0 ^ (0xD1B54A32D192ED03ull *
                                     (static_cast<uint64_t>(j) + key1));
            for (int64_t q = 0; q < n; ++q) {
              int32_t f;
              do {
                f = static_cast<int32_t>(
                    Bounded(&state, static_cast<uint32_t>(e)));
              } while (test(f));
              mark(f);
              oj[pj[q]] = f;
            }
            if (bitmap) {  // clear what was set: the old row and the draws
              for (int64_t k = 0; k < s; ++k) {
                bits[ij[k] >> 6] = 0;
                bits[oj[k] >> 6] = 0;
              }
            } else {
              avoid.clear();
            }
          }
        });
  }

 private:
  int64_t num_moved_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("Xmc>SetRewire").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SetRewireOp<float>);
REGISTER_KERNEL_BUILDER(Name("Xmc>SetRewire")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<Eigen::bfloat16>("T"),
                        SetRewireOp<Eigen::bfloat16>);

}  // namespace
}  // namespace xmc_tf
