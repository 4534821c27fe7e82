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
#include <string>
#include <utility>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/locked_variables.h"
#include "ops/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
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

// The per-row work of a rewire, with one thread's scratch (a bitmap of
// num_features bits, or a list of the sources to avoid; the row's keys).
// Rewire(j, ...) gives the same draws whatever thread and order run it.
class RowRewirer {
 public:
  RowRewirer(int64_t s, int64_t n, int64_t e, uint64_t key0, uint64_t key1)
      : s_(s), n_(n), e_(e), key0_(key0), key1_(key1),
        // Avoid every current source when enough others exist, else only
        // the ones that stay (as xmc_tf.callbacks.rewiring.rewire).
        avoid_all_(e - s >= n), bitmap_(e <= kMaxBitmapBits),
        bits_(bitmap_ ? (e + 63) / 64 : 0, 0), keys_(s) {}

  // Row j: the old sources ij and weights wj in; the new sources oj (may
  // not alias ij) and the moved positions pj[0:n] (sorted) out.
  template <typename T>
  void Rewire(int64_t j, const int32_t* ij, const T* wj, int32_t* oj,
              int64_t* pj) {
    std::copy(ij, ij + s_, oj);
    if (n_ == 0) return;
    SmallestPositions(wj, s_, n_, &keys_, pj);
    if (avoid_all_) {
      for (int64_t k = 0; k < s_; ++k) Mark(ij[k]);
    } else {
      // Only the kept sources: positions pj are sorted.
      int64_t q = 0;
      for (int64_t k = 0; k < s_; ++k) {
        if (q < n_ && pj[q] == k) {
          ++q;
          continue;
        }
        Mark(ij[k]);
      }
    }
    uint64_t state =
        key0_ ^ (0xD1B54A32D192ED03ull * (static_cast<uint64_t>(j) + key1_));
    for (int64_t q = 0; q < n_; ++q) {
      int32_t f;
      do {
        f = static_cast<int32_t>(Bounded(&state, static_cast<uint32_t>(e_)));
      } while (Test(f));
      Mark(f);
      oj[pj[q]] = f;
    }
    if (bitmap_) {  // clear what was set: the old row and the draws
      for (int64_t k = 0; k < s_; ++k) {
        bits_[ij[k] >> 6] = 0;
        bits_[oj[k] >> 6] = 0;
      }
    } else {
      avoid_.clear();
    }
  }

 private:
  bool Test(int32_t f) const {
    if (bitmap_) return ((bits_[f >> 6] >> (f & 63)) & 1) != 0;
    return std::find(avoid_.begin(), avoid_.end(), f) != avoid_.end();
  }
  void Mark(int32_t f) {
    if (bitmap_) {
      bits_[f >> 6] |= uint64_t{1} << (f & 63);
    } else {
      avoid_.push_back(f);
    }
  }

  const int64_t s_, n_, e_;
  const uint64_t key0_, key1_;
  const bool avoid_all_, bitmap_;
  std::vector<uint64_t> bits_;
  std::vector<uint64_t> keys_;
  std::vector<int32_t> avoid_;  // scan mode: sources to avoid
};

// Checks num_moved n against fan_in s and num_features e (every label needs
// s distinct sources), and reads the [2] seed.
Status CheckRewire(const Tensor& num_features_t, const Tensor& seed_t,
                   int64_t s, int64_t n, int64_t* e, uint64_t* key0,
                   uint64_t* key1) {
  TF_RETURN_IF_ERROR(NonNegativeScalar(num_features_t, "num_features", e));
  if (!TensorShapeUtils::IsVector(seed_t.shape()) ||
      seed_t.NumElements() != 2) {
    return errors::InvalidArgument("seed must be a [2] vector, got shape ",
                                   seed_t.shape().DebugString());
  }
  if (n > s) {
    return errors::InvalidArgument("num_moved = ", n, " must be <= fan_in = ",
                                   s);
  }
  if (*e < s || *e > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument(
        "num_features = ", *e, " must be in [fan_in = ", s,
        ", 2^31): every label needs fan_in distinct sources");
  }
  const auto seed = seed_t.flat<int64_t>();
  *key0 = static_cast<uint64_t>(seed(0));
  *key1 = static_cast<uint64_t>(seed(1));
  return ::tensorflow::OkStatus();
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
    OP_REQUIRES_OK(ctx, CheckMatrix(indices, "indices"));
    OP_REQUIRES_OK(ctx, CheckSameShape(weights, "weights", indices, "indices",
                                       "[num_labels, fan_in]"));
    const int64_t m = indices.dim_size(0), s = indices.dim_size(1);
    const int64_t n = num_moved_;
    int64_t e = 0;
    uint64_t key0 = 0, key1 = 0;
    OP_REQUIRES_OK(ctx, CheckRewire(ctx->input(2), ctx->input(3), s, n, &e,
                                    &key0, &key1));
    const int32_t* idx = indices.flat<int32_t>().data();
    const T* w = weights.flat<T>().data();

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
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, m, 20 * s + 60 * n + 20,
        [&](int64_t start, int64_t limit) {
          RowRewirer rewirer(s, n, e, key0, key1);
          for (int64_t j = start; j < limit; ++j) {
            rewirer.Rewire(j, idx + j * s, w + j * s, out + j * s,
                           pos + j * n);
          }
        });
  }

 private:
  int64_t num_moved_ = 0;
};

// Xmc>ResourceSetRewire: the same rewire, written into the variables: the
// indices variable's rows in place, and the moved positions of the weights
// and of every state variable (optimizer slots, a fused update's state; any
// dtype) set to zero.  Outputs the number moved and the sum of the pruned
// |weights| (float64).  Nothing of [m, s] size is allocated (unless a
// buffer is shared: LockedVariables copies it first).
template <typename T>
class ResourceSetRewireOp : public OpKernel {
 public:
  explicit ResourceSetRewireOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_moved", &num_moved_));
    OP_REQUIRES_OK(c, c->GetAttr("num_state", &num_state_));
  }

  void Compute(OpKernelContext* ctx) override {
    // The shape comes from the indices variable: look it up first.
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> probe;
    OP_REQUIRES_OK(ctx, ::tensorflow::LookupResource(
                            ctx, ::tensorflow::HandleFromInput(ctx, 0),
                            &probe));
    TensorShape shape;
    {
      ::tensorflow::tf_shared_lock lock(*probe->mu());
      shape = probe->tensor()->shape();
    }
    probe.reset();
    OP_REQUIRES(ctx, shape.dims() == 2,
                errors::InvalidArgument(
                    "indices must be a [num_labels, fan_in] matrix, got shape ",
                    shape.DebugString()));
    const int64_t m = shape.dim_size(0), s = shape.dim_size(1);
    const int64_t n = num_moved_;
    const int first_scalar = 2 + num_state_;
    int64_t e = 0;
    uint64_t key0 = 0, key1 = 0;
    OP_REQUIRES_OK(ctx, CheckRewire(ctx->input(first_scalar),
                                    ctx->input(first_scalar + 1), s, n, &e,
                                    &key0, &key1));
    std::vector<std::string> names = {"indices", "weights"};
    std::vector<::tensorflow::DataType> dtypes = {
        ::tensorflow::DT_INT32, ::tensorflow::DataTypeToEnum<T>::value};
    for (int i = 0; i < num_state_; ++i) {
      names.push_back("state[" + std::to_string(i) + "]");
      dtypes.push_back(::tensorflow::DT_INVALID);
    }
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Init(ctx, 0, 2 + num_state_, names, dtypes,
                                  shape));
    const int32_t* idx = vars.data<int32_t>(0);
    const int64_t bad = FirstOutOfRange(ctx, idx, m * s, 0, e);
    OP_REQUIRES(ctx, bad < 0,
                OutOfRange("indices", shape, bad, idx[bad], 0, e,
                           "num_features"));
    Tensor* moved_t = nullptr;
    Tensor* pruned_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &moved_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &pruned_t));
    moved_t->scalar<int64_t>()() = m * n;
    pruned_t->scalar<double>()() = 0.0;
    if (m == 0 || n == 0) return;
    OP_REQUIRES_OK(ctx, vars.PrepareToWrite(ctx));
    int32_t* ind = vars.data<int32_t>(0);
    T* w = vars.data<T>(1);
    std::vector<char*> state(num_state_);
    std::vector<int64_t> bytes(num_state_);
    for (int i = 0; i < num_state_; ++i) {
      Tensor* t = vars.tensor(2 + i);
      state[i] = const_cast<char*>(t->tensor_data().data());
      bytes[i] = ::tensorflow::DataTypeSize(t->dtype());
    }
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::mutex mu;
    double total = 0.0;  // the shards' sums, added under mu (stats only)
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, m, 20 * s + 80 * n + 20,
        [&](int64_t start, int64_t limit) {
          RowRewirer rewirer(s, n, e, key0, key1);
          std::vector<int32_t> old(s);
          std::vector<int64_t> pj(n);
          double sum = 0.0;
          for (int64_t j = start; j < limit; ++j) {
            int32_t* row = ind + j * s;
            std::copy(row, row + s, old.begin());
            rewirer.Rewire(j, old.data(), w + j * s, row, pj.data());
            for (int64_t q = 0; q < n; ++q) {
              const int64_t p = j * s + pj[q];
              sum += std::fabs(static_cast<double>(static_cast<float>(w[p])));
              w[p] = static_cast<T>(0.0f);
              for (int i = 0; i < num_state_; ++i) {
                std::memset(state[i] + p * bytes[i], 0, bytes[i]);
              }
            }
          }
          ::tensorflow::mutex_lock lock(mu);
          total += sum;
        });
    pruned_t->scalar<double>()() = total;
  }

 private:
  int64_t num_moved_ = 0;
  int num_state_ = 0;
};

#define REGISTER(T)                                                          \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("Xmc>SetRewire").Device(DEVICE_CPU).TypeConstraint<T>("T"),       \
      SetRewireOp<T>);                                                       \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("Xmc>ResourceSetRewire").Device(DEVICE_CPU).TypeConstraint<T>(    \
          "T"),                                                              \
      ResourceSetRewireOp<T>);
REGISTER(float);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace xmc_tf
