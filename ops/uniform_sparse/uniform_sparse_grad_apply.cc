// CPU kernel of Xmc>UniformSparseGradApply: the features gradient of the
// uniform-sparse product and the weights' optimizer step in place, so that
// no dense [num_labels, fan_in] weights gradient (and no optimizer
// temporary of that size) exists.  See uniform_sparse_ops.cc for the op
// contract.
//
// Sources: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Algorithms 2 and 3 (the two gradients,
// skipping zero signal); Kingma & Ba, "Adam", Algorithm 1 per row (the
// "lazy" update of labels with signal); Kahan, "Further remarks on reducing
// truncation errors" (CACM 1965): compensated summation of bfloat16 weights,
// as ELMO (Zhang et al., ICML 2025) trains its classifier in pure bfloat16.
//
// Design:
//  1. The variables (weights, then the state in op order) are looked up,
//     checked (distinct, initialised, dtype T, shape [num_labels, fan_in])
//     and locked exclusively in address order (ops/common/
//     locked_variables.h).
//  2. The features gradient is the registered gradient's own CPU path
//     (GradientsCpu with the weights buffer read in place), run before any
//     write: it checks the index rows of every label with signal, so a bad
//     index fails the op with nothing written.
//  3. A buffer another tensor still shares (a read that is still alive) is
//     copied before the write, as TensorFlow's training ops do; the
//     variables are not put in copy-on-read mode (the forward's dense read
//     keeps sharing the buffer).
//  4. The labels are sharded in blocks of kSignalBlock over the intra-op
//     pool (with lazy=false and Adam, a label without signal takes the
//     step of a zero gradient).  A block's backward columns are scanned row by row (whole cache
//     lines), its non-zeros bucketed by label; each label with signal then
//     forms its fan_in gradient entries from its non-zeros only (instance
//     rows of features gathered at its indices) and updates its row of
//     weights and state in one pass.  Rows are disjoint per thread.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/locked_variables.h"
#include "ops/common/validation.h"
#include "ops/uniform_sparse/uniform_sparse_cpu.h"
#include "ops/uniform_sparse/uniform_sparse_cpu_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

struct StepParams {
  bool adam = false, kahan = false, lazy = true;
  float alpha = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, epsilon = 0;
};

// One label's row: gradient entries g[0:s] applied to w (and c, m, v).
template <typename T>
inline void UpdateRow(const StepParams& p, const float* g, int64_t s, T* w,
                      T* c, T* m, T* v) {
  for (int64_t k = 0; k < s; ++k) {
    float u;
    if (p.adam) {
      float mk = static_cast<float>(m[k]);
      float vk = static_cast<float>(v[k]);
      mk += (g[k] - mk) * p.one_minus_beta1;
      vk += (g[k] * g[k] - vk) * p.one_minus_beta2;
      m[k] = static_cast<T>(mk);
      v[k] = static_cast<T>(vk);
      u = -(mk * p.alpha) / (std::sqrt(vk) + p.epsilon);
    } else {
      u = -p.alpha * g[k];
    }
    const float wk = static_cast<float>(w[k]);
    if (p.kahan) {
      const float y = u - static_cast<float>(c[k]);
      const T t = static_cast<T>(wk + y);
      c[k] = static_cast<T>((static_cast<float>(t) - wk) - y);
      w[k] = t;
    } else {
      w[k] = static_cast<T>(wk + u);
    }
  }
}

template <typename T>
class UniformSparseGradApplyOp : public OpKernel {
 public:
  explicit UniformSparseGradApplyOp(OpKernelConstruction* c) : OpKernel(c) {
    std::string rule;
    OP_REQUIRES_OK(c, c->GetAttr("rule", &rule));
    OP_REQUIRES_OK(c, c->GetAttr("kahan", &params_.kahan));
    OP_REQUIRES_OK(c, c->GetAttr("lazy", &params_.lazy));
    OP_REQUIRES_OK(c, c->GetAttr("num_state", &num_state_));
    params_.adam = rule == "adam";
    // SGD moves a weight only along its gradient: every row without
    // signal keeps its weights either way.
    if (!params_.adam) params_.lazy = true;
    const int expected = (params_.kahan ? 1 : 0) + (params_.adam ? 2 : 0);
    OP_REQUIRES(c, num_state_ == expected,
                errors::InvalidArgument(
                    "rule '", rule, "' with kahan=", params_.kahan,
                    " takes ", expected, " state variables, got ",
                    num_state_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& features = ctx->input(1);
    const Tensor& indices = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckMatrix(backward, "backward"));
    OP_REQUIRES_OK(ctx, CheckMatrix(features, "features"));
    OP_REQUIRES_OK(ctx, CheckMatrix(indices, "indices"));
    UniformSparseDims d;
    d.batch = features.dim_size(0);
    d.num_features = features.dim_size(1);
    d.num_labels = indices.dim_size(0);
    d.fan_in = indices.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckInt32Indexable(d.num_features, "num_features"));
    OP_REQUIRES(ctx,
                backward.dim_size(0) == d.batch &&
                    backward.dim_size(1) == d.num_labels,
                errors::InvalidArgument(
                    "backward shape ", backward.shape().DebugString(),
                    " must be [", d.batch, ", ", d.num_labels,
                    "] ([batch, num_labels])"));
    StepParams p = params_;
    const int first_scalar = 4 + num_state_;
    float* scalars[4] = {&p.alpha, &p.one_minus_beta1, &p.one_minus_beta2,
                         &p.epsilon};
    const char* scalar_names[4] = {"alpha", "one_minus_beta1",
                                   "one_minus_beta2", "epsilon"};
    for (int i = 0; i < 4; ++i) {
      const Tensor& t = ctx->input(first_scalar + i);
      OP_REQUIRES_OK(ctx, CheckScalar(t, scalar_names[i]));
      *scalars[i] = t.scalar<float>()();
    }
    std::vector<std::string> names = {"weights"};
    if (p.kahan) names.push_back("compensation");
    if (p.adam) {
      names.push_back("m");
      names.push_back("v");
    }
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Init(ctx, 3, 1 + num_state_, names,
                                  std::vector<::tensorflow::DataType>(
                                      1 + num_state_, features.dtype()),
                                  indices.shape()));
    Tensor* grad_features = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, features.shape(), &grad_features));
    const T* back = backward.flat<T>().data();
    const T* feat = features.flat<T>().data();
    const int32_t* idx = indices.flat<int32_t>().data();
    // 2. The features gradient with the weights before the step; it checks
    // the index rows of the labels with signal.
    uniform_sparse_cpu::GradientsCpu<T>(ctx, back, nullptr, idx,
                                        vars.data<T>(0), d,
                                        grad_features->flat<T>().data(),
                                        nullptr);
    if (!ctx->status().ok()) return;
    if (d.num_labels == 0 || d.fan_in == 0 || d.batch == 0) return;
    OP_REQUIRES_OK(ctx, vars.PrepareToWrite(ctx));
    T* w = vars.data<T>(0);
    int slot = 1;
    T* c = p.kahan ? vars.data<T>(slot++) : nullptr;
    T* m = p.adam ? vars.data<T>(slot++) : nullptr;
    T* v = p.adam ? vars.data<T>(slot++) : nullptr;
    Apply(ctx, p, back, feat, idx, d, w, c, m, v);
  }

 private:
  // 4. The weights' step of every label with signal (see the file comment).
  static void Apply(OpKernelContext* ctx, const StepParams& p, const T* back,
                    const T* feat, const int32_t* idx,
                    const UniformSparseDims& d, T* w, T* c, T* m, T* v) {
    constexpr int64_t kBlock = uniform_sparse_cpu::kSignalBlock;
    const int64_t s = d.fan_in;
    const int64_t e = d.num_features;
    const int64_t blocks = (d.num_labels + kBlock - 1) / kBlock;
    std::atomic<int64_t> bad{-1};
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, blocks,
        d.batch * kBlock * 4 + kBlock * s * 16,
        [&](int64_t start, int64_t limit) {
          std::vector<int32_t> count(kBlock + 1), fill(kBlock);
          std::vector<int32_t> rows;
          std::vector<float> vals;
          std::vector<float> g(s);
          for (int64_t b = start; b < limit; ++b) {
            const int64_t j0 = b * kBlock;
            const int64_t n = std::min(kBlock, d.num_labels - j0);
            // The block's non-zeros, bucketed by label (counting sort).
            std::fill(count.begin(), count.end(), 0);
            for (int64_t i = 0; i < d.batch; ++i) {
              const T* row = back + i * d.num_labels + j0;
              if (uniform_sparse_cpu::AllZero(row, n)) continue;
              for (int64_t l = 0; l < n; ++l) {
                if (static_cast<float>(row[l]) != 0.0f) ++count[l + 1];
              }
            }
            for (int64_t l = 0; l < n; ++l) count[l + 1] += count[l];
            const int64_t nnz = count[n];
            if (nnz == 0 && p.lazy) continue;
            rows.resize(nnz);
            vals.resize(nnz);
            std::copy(count.begin(), count.begin() + n, fill.begin());
            for (int64_t i = 0; i < d.batch; ++i) {
              const T* row = back + i * d.num_labels + j0;
              if (uniform_sparse_cpu::AllZero(row, n)) continue;
              for (int64_t l = 0; l < n; ++l) {
                const float x = static_cast<float>(row[l]);
                if (x != 0.0f) {
                  rows[fill[l]] = static_cast<int32_t>(i);
                  vals[fill[l]++] = x;
                }
              }
            }
            for (int64_t l = 0; l < n; ++l) {
              const int64_t j = j0 + l;
              if (count[l] == count[l + 1]) {
                if (p.lazy) continue;
                // Adam on a zero gradient: the moments decay and the
                // weights move along the first one (keras' Adam on a
                // dense gradient).  The indices are not read.
                std::fill(g.begin(), g.end(), 0.0f);
                const int64_t off = j * s;
                UpdateRow<T>(p, g.data(), s, w + off, c ? c + off : nullptr,
                             m + off, v + off);
                continue;
              }
              const int32_t* ij = idx + j * s;
              bool ok = true;
              for (int64_t k = 0; k < s; ++k) {
                if (static_cast<uint32_t>(ij[k]) >=
                    static_cast<uint64_t>(e)) {
                  int64_t pos = j * s + k, seen = bad.load();
                  while ((seen < 0 || pos < seen) &&
                         !bad.compare_exchange_weak(seen, pos)) {
                  }
                  ok = false;
                  break;
                }
              }
              if (!ok) continue;
              std::fill(g.begin(), g.end(), 0.0f);
              for (int64_t q = count[l]; q < count[l + 1]; ++q) {
                const T* x = feat + static_cast<int64_t>(rows[q]) * e;
                const float a = vals[q];
                for (int64_t k = 0; k < s; ++k) {
                  g[k] += a * static_cast<float>(x[ij[k]]);
                }
              }
              const int64_t off = j * s;
              UpdateRow<T>(p, g.data(), s, w + off,
                           c ? c + off : nullptr, m ? m + off : nullptr,
                           v ? v + off : nullptr);
            }
          }
        });
    // Unreachable after GradientsCpu's check of the same rows; kept so
    // that the loop above never depends on it for memory safety.
    if (bad.load() >= 0) uniform_sparse_cpu::FailIndex(ctx, idx, d, bad.load());
  }

  StepParams params_;
  int num_state_ = 0;
};

#define REGISTER(T)                                                        \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseGradApply")               \
                              .Device(::tensorflow::DEVICE_CPU)            \
                              .TypeConstraint<T>("T"),                     \
                          UniformSparseGradApplyOp<T>);
REGISTER(float);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace xmc_tf
