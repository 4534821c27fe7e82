// CPU kernels (and, when built with nvcc, GPU registrations) of the fused
// squared-hinge family.  See hinge_ops.cc for the op contracts and
// hinge_kernels.h for the per-block functors.
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 2 eq. 2 (one-vs-all squared hinge) and
// Sec. 3.3 (exact zeros of its gradient are skipped downstream).
//
// CPU design (TensorFlow's intra-op thread pool, ::tensorflow::Shard):
//  * One OpKernel class per op, templated on the device (ops/common/
//    device.h): it checks ranks and shapes and allocates the output, then
//    calls functor::SquaredHingeLoss[Grad]<Device, TL> (hinge_kernels.h).
//  * The CPU functors check every label id (b * n reads on the thread pool,
//    ops/common/bad_index.h: tiny next to the b * m scores) before any work,
//    and fail with InvalidArgument naming the first bad entry.
//  * The work units are (row, block of kCpuBlock columns) pairs, so a small
//    batch still keeps every thread busy.  A unit makes one dense pass over
//    its block with every label a negative, then scans the row's n ids and
//    corrects the positives that fall in its block: the loss adds the
//    positive-minus-negative term once per distinct id (the ids in the block
//    are sorted and deduplicated: a repeated id counts once, as in
//    xmc_tf.losses.dense_targets), the gradient overwrites the entry.
//  * The loss writes one float64 partial sum per unit into a [b, blocks]
//    buffer that is summed per row in block order: the result does not
//    depend on the thread count.  The gradient writes its output only.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/gpu.h"
#include "ops/common/validation.h"
#include "ops/common/widen.h"
#include "ops/hinge/hinge_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

namespace {

constexpr char kLabelsNote[] = "num_labels; -1 is padding";

// Ranks and shapes of scores [b, m], labels [b, n] and (when not null)
// upstream [b].
Status ValidateHingeShapes(const Tensor& scores, const Tensor& labels,
                           const Tensor* upstream, HingeDims* d) {
  if (scores.dims() != 2 || labels.dims() != 2) {
    return errors::InvalidArgument(
        "scores [batch, num_labels] and labels [batch, n] must be matrices, "
        "got shapes ",
        scores.shape().DebugString(), " and ", labels.shape().DebugString());
  }
  d->batch = scores.dim_size(0);
  d->num_labels = scores.dim_size(1);
  d->n = labels.dim_size(1);
  d->blocks = (d->num_labels + hinge::kCpuBlock - 1) / hinge::kCpuBlock;
  if (labels.dim_size(0) != d->batch) {
    return errors::InvalidArgument(
        "labels shape ", labels.shape().DebugString(),
        " must be [batch, n] with batch = ", d->batch, " (rows of scores)");
  }
  if (upstream != nullptr &&
      (upstream->dims() != 1 || upstream->dim_size(0) != d->batch)) {
    return errors::InvalidArgument(
        "upstream shape ", upstream->shape().DebugString(),
        " must be [batch] with batch = ", d->batch, " (rows of scores)");
  }
  return ::tensorflow::OkStatus();
}

// Every label id in [-1, num_labels); the value of the first bad one is
// named when known (`ids` on the host), else its position only.
template <typename TL>
Status ValidateLabelIds(OpKernelContext* ctx, const TL* ids,
                        const HingeDims& d) {
  const int64_t p = FirstOutOfRange(ctx, ids, d.batch * d.n, -1, d.num_labels);
  if (p < 0) return ::tensorflow::OkStatus();
  return OutOfRange("labels", TensorShape({d.batch, d.n}), p,
                    static_cast<int64_t>(ids[p]), -1, d.num_labels,
                    kLabelsNote);
}

// The `margin` attribute; a missing or non-finite one fails the
// construction (the kernel then never runs).
float MarginAttr(OpKernelConstruction* c) {
  float margin = 1.0f;
  Status status = c->GetAttr("margin", &margin);
  if (status.ok() && !std::isfinite(margin)) {
    status = errors::InvalidArgument("margin must be finite, got ", margin);
  }
  if (!status.ok()) c->CtxFailure(status);
  return margin;
}

// The ids of labels row `row` in [j0, j1) (unsorted, with repeats).
template <typename TL>
void IdsInBlock(const TL* row, int64_t n, int64_t j0, int64_t j1,
                std::vector<int64_t>* out) {
  out->clear();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = static_cast<int64_t>(row[k]);
    if (id >= j0 && id < j1) out->push_back(id);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// CPU functors.

namespace functor {

template <typename T, typename TL>
struct SquaredHingeLoss<CpuDevice, T, TL> {
  void operator()(OpKernelContext* ctx, const T* x, const TL* ids,
                  const HingeDims& d, float margin, float* loss) const {
    OP_REQUIRES_OK(ctx, ValidateLabelIds<TL>(ctx, ids, d));
    if (d.batch == 0) return;
    if (d.blocks == 0) {  // no labels: every row sums nothing
      std::fill(loss, loss + d.batch, 0.0f);
      return;
    }
    Tensor partial_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_DOUBLE,
                                           TensorShape({d.batch * d.blocks}),
                                           &partial_t));
    double* partial = partial_t.flat<double>().data();
    const int64_t m = d.num_labels, n = d.n, blocks = d.blocks;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, d.batch * blocks,
        hinge::kCpuBlock + 4 * n, [&](int64_t start, int64_t limit) {
          std::vector<int64_t> in_block;
          std::vector<float> wide;  // T != float: the block as floats
          for (int64_t u = start; u < limit; ++u) {
            const int64_t i = u / blocks;
            const int64_t j0 = (u % blocks) * hinge::kCpuBlock;
            const int64_t j1 = std::min(m, j0 + hinge::kCpuBlock);
            const T* row = x + i * m;
            double sum = hinge::NegativeSquaredHingeSum(
                WidenToFloat(row + j0, j1 - j0, &wide), j1 - j0, margin);
            IdsInBlock<TL>(ids + i * n, n, j0, j1, &in_block);
            std::sort(in_block.begin(), in_block.end());
            const auto end = std::unique(in_block.begin(), in_block.end());
            for (auto it = in_block.begin(); it != end; ++it) {
              sum += hinge::PositiveLossCorrection(
                  static_cast<float>(row[*it]), margin);
            }
            partial[u] = sum;
          }
        });
    for (int64_t i = 0; i < d.batch; ++i) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) sum += partial[i * blocks + b];
      loss[i] = static_cast<float>(sum);
    }
  }
};

template <typename T, typename TL>
struct SquaredHingeLossGrad<CpuDevice, T, TL> {
  void operator()(OpKernelContext* ctx, const T* x, const TL* ids,
                  const float* up, const HingeDims& d, float margin,
                  T* grad) const {
    OP_REQUIRES_OK(ctx, ValidateLabelIds<TL>(ctx, ids, d));
    if (d.batch == 0 || d.blocks == 0) return;
    const int64_t m = d.num_labels, n = d.n, blocks = d.blocks;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, d.batch * blocks,
        2 * hinge::kCpuBlock + 2 * n, [&](int64_t start, int64_t limit) {
          std::vector<float> wide, wide_out;  // T != float only
          for (int64_t u = start; u < limit; ++u) {
            const int64_t i = u / blocks;
            const int64_t j0 = (u % blocks) * hinge::kCpuBlock;
            const int64_t j1 = std::min(m, j0 + hinge::kCpuBlock);
            const T* row = x + i * m;
            T* out = grad + i * m;
            const float* in = WidenToFloat(row + j0, j1 - j0, &wide);
            if constexpr (std::is_same<T, float>::value) {
              hinge::NegativeSquaredHingeGrad(in, j1 - j0, margin, up[i],
                                              out + j0);
            } else {  // in float, then one rounding to T per entry
              wide_out.resize(j1 - j0);
              hinge::NegativeSquaredHingeGrad(in, j1 - j0, margin, up[i],
                                              wide_out.data());
              for (int64_t j = j0; j < j1; ++j) {
                out[j] = static_cast<T>(wide_out[j - j0]);
              }
            }
            const TL* row_ids = ids + i * n;
            for (int64_t k = 0; k < n; ++k) {
              const int64_t id = static_cast<int64_t>(row_ids[k]);
              if (id >= j0 && id < j1) {
                out[id] = static_cast<T>(hinge::PositiveGrad(
                    static_cast<float>(row[id]), margin, up[i]));
              }
            }
          }
        });
  }
};

// ---------------------------------------------------------------------------
// GPU functors: framework-free CUDA launchers (hinge_kernels.cu.cc) called on
// TensorFlow's stream; they range-check the ids on the device, so the
// message names the position only.

#if XMC_TF_WITH_CUDA

// Runs a hinge launcher `launch(error_scratch, bad_position, stream)` and
// turns its result into the op status.
template <typename Launch>
void RunHingeGpu(OpKernelContext* ctx, const HingeDims& d,
                 const Launch& launch) {
  int64_t bad = -1;
  OP_REQUIRES_OK(ctx, RunCheckedLauncher(ctx, "a squared-hinge kernel", 1,
                                         &bad, launch));
  if (bad >= 0) {
    ctx->CtxFailure(OutOfRange("labels", TensorShape({d.batch, d.n}), bad,
                               std::nullopt, -1, d.num_labels, kLabelsNote));
  }
}

template <typename TL>
struct SquaredHingeLoss<GpuDevice, float, TL> {
  void operator()(OpKernelContext* ctx, const float* scores, const TL* labels,
                  const HingeDims& d, float margin, float* loss) const {
    Tensor partial;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({XmcSquaredHingeLossScratchFloats(
                                d.batch, d.num_labels)}),
                            &partial));
    RunHingeGpu(ctx, d, [&](int64_t* scratch, int64_t* bad, void* stream) {
      return XmcSquaredHingeLossGpuF32(scores, labels, sizeof(TL) == 8, loss,
                                       d.batch, d.num_labels, d.n, margin,
                                       partial.flat<float>().data(), scratch,
                                       bad, stream);
    });
  }
};

template <typename TL>
struct SquaredHingeLossGrad<GpuDevice, float, TL> {
  void operator()(OpKernelContext* ctx, const float* scores, const TL* labels,
                  const float* upstream, const HingeDims& d, float margin,
                  float* grad) const {
    RunHingeGpu(ctx, d, [&](int64_t* scratch, int64_t* bad, void* stream) {
      return XmcSquaredHingeLossGradGpuF32(scores, labels, sizeof(TL) == 8,
                                           upstream, grad, d.batch,
                                           d.num_labels, d.n, margin, scratch,
                                           bad, stream);
    });
  }
};

#endif  // XMC_TF_WITH_CUDA

}  // namespace functor

// ---------------------------------------------------------------------------
// The op kernels (one class per op and device).

namespace {

template <typename Device, typename T, typename TL>
class SquaredHingeLossOp : public OpKernel {
 public:
  explicit SquaredHingeLossOp(OpKernelConstruction* c)
      : OpKernel(c), margin_(MarginAttr(c)) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& scores = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    HingeDims d;
    OP_REQUIRES_OK(ctx, ValidateHingeShapes(scores, labels, nullptr, &d));
    Tensor* loss = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({d.batch}), &loss));
    functor::SquaredHingeLoss<Device, T, TL>()(
        ctx, scores.flat<T>().data(), labels.flat<TL>().data(), d, margin_,
        loss->flat<float>().data());
  }

 private:
  const float margin_;
};

template <typename Device, typename T, typename TL>
class SquaredHingeLossGradOp : public OpKernel {
 public:
  explicit SquaredHingeLossGradOp(OpKernelConstruction* c)
      : OpKernel(c), margin_(MarginAttr(c)) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& scores = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& upstream = ctx->input(2);
    HingeDims d;
    OP_REQUIRES_OK(ctx, ValidateHingeShapes(scores, labels, &upstream, &d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, scores.shape(), &grad));
    functor::SquaredHingeLossGrad<Device, T, TL>()(
        ctx, scores.flat<T>().data(), labels.flat<TL>().data(),
        upstream.flat<float>().data(), d, margin_, grad->flat<T>().data());
  }

 private:
  const float margin_;
};

#define REGISTER(DEVICE_NAME, Dev, T, TL)                       \
  REGISTER_KERNEL_BUILDER(Name("Xmc>SquaredHingeLoss")          \
                              .Device(DEVICE_NAME)              \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<TL>("Tlabels"),   \
                          SquaredHingeLossOp<Dev, T, TL>);      \
  REGISTER_KERNEL_BUILDER(Name("Xmc>SquaredHingeLossGrad")      \
                              .Device(DEVICE_NAME)              \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<TL>("Tlabels"),   \
                          SquaredHingeLossGradOp<Dev, T, TL>);
#define REGISTER_CPU(T)                       \
  REGISTER(DEVICE_CPU, CpuDevice, T, int32_t) \
  REGISTER(DEVICE_CPU, CpuDevice, T, int64_t)

REGISTER_CPU(float);
REGISTER_CPU(Eigen::half);      // widened to float block by block
REGISTER_CPU(Eigen::bfloat16);  // widened to float block by block
#if XMC_TF_WITH_CUDA
REGISTER(DEVICE_GPU, GpuDevice, float, int32_t);
REGISTER(DEVICE_GPU, GpuDevice, float, int64_t);
#endif
#undef REGISTER_CPU
#undef REGISTER

}  // namespace
}  // namespace xmc_tf
