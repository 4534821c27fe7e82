// CPU kernels of the optimizer family (Xmc>ResourceSparseApplyAdam,
// Xmc>ResourceApplyAdam).  See optimizer_ops.cc for the op contract and
// optimizer_kernels.h for the per-row update.  One OpKernel class per op,
// templated on the device (ops/common/device.h), locks and checks the
// variables, then calls functor::SparseApplyAdam / ApplyAdam<Device, ...>
// (CpuDevice below).
//
// Source: Kingma & Ba, "Adam", ICLR 2015, Algorithm 1, applied per row.
//
// CPU design: the k rows (dense op: blocks of elements) are sharded over TensorFlow's intra-op thread pool;
// each row is one contiguous, vectorisable pass that reads grad and writes
// var, m and v in place, so a step moves each touched element once (the
// composite gather / element-wise / scatter update moves it about a dozen
// times).  The indices are validated first (range, and no id twice: two
// threads writing one row would race), before anything is written.  The
// three variables are locked exclusively in address order (no deadlock with
// another op locking the same variables), and a buffer that another tensor
// still shares is copied before the in-place write, as TensorFlow's sparse
// training ops do; the row update then puts the variables in copy-on-read
// mode like any TensorFlow sparse op (EnsureSparseVariableAccess), the dense
// update does not (a Dense kernel's reads keep sharing its buffer).

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "ops/common/validation.h"
#include "ops/optimizers/optimizer_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

namespace {

constexpr std::array<const char*, 3> kVariableNames = {"var", "m", "v"};

// Checks that every id is in [0, n) and that no id repeats.
template <typename Index>
Status ValidateRowIds(const Tensor& indices, int64_t n) {
  const auto ids = indices.flat<Index>();
  const int64_t k = ids.size();
  std::vector<std::pair<Index, int64_t>> sorted(k);
  for (int64_t r = 0; r < k; ++r) {
    const Index id = ids(r);
    if (id < 0 || static_cast<int64_t>(id) >= n) {
      return OutOfRange("indices", indices.shape(), r,
                        static_cast<int64_t>(id), 0, n, "rows of var");
    }
    sorted[r] = {id, r};
  }
  std::sort(sorted.begin(), sorted.end());
  for (int64_t r = 1; r < k; ++r) {
    if (sorted[r].first == sorted[r - 1].first) {
      return errors::InvalidArgument(
          "indices[", sorted[r - 1].second, "] and indices[",
          sorted[r].second, "] are both ", sorted[r].first,
          ": ids must be unique (sum the gradient rows of a repeated id "
          "first)");
    }
  }
  return ::tensorflow::OkStatus();
}

// The three variables (var, m, v) of an Adam op, looked up, checked and held
// under their exclusive locks (taken in address order: no deadlock with
// another op locking the same variables) for the object's lifetime.
class AdamVariables {
 public:
  // Looks up inputs 0-2 and checks: three distinct initialised variables of
  // dtype `dtype` and one shape.
  Status Init(OpKernelContext* ctx, ::tensorflow::DataType dtype) {
    for (int i = 0; i < 3; ++i) {
      TF_RETURN_IF_ERROR(::tensorflow::LookupResource(
          ctx, ::tensorflow::HandleFromInput(ctx, i), &vars_[i]));
    }
    for (int i = 0; i < 3; ++i) {
      for (int j = i + 1; j < 3; ++j) {
        if (vars_[i].get() == vars_[j].get()) {
          return errors::InvalidArgument(kVariableNames[i], " and ",
                                         kVariableNames[j],
                                         " are the same variable");
        }
      }
    }
    std::array<::tensorflow::Var*, 3> order = {vars_[0].get(), vars_[1].get(),
                                               vars_[2].get()};
    std::sort(order.begin(), order.end(), std::less<::tensorflow::Var*>());
    for (int i = 0; i < 3; ++i) locks_[i].emplace(*order[i]->mu());
    for (int i = 0; i < 3; ++i) {
      Tensor* t = vars_[i]->tensor();
      if (!vars_[i]->is_initialized || !t->IsInitialized()) {
        return errors::FailedPrecondition("variable ", kVariableNames[i],
                                          " is not initialized");
      }
      if (t->dtype() != dtype) {
        return errors::InvalidArgument(
            "variable ", kVariableNames[i], " has dtype ",
            ::tensorflow::DataTypeString(t->dtype()), ", grad has ",
            ::tensorflow::DataTypeString(dtype));
      }
      if (t->shape() != shape()) {
        return errors::InvalidArgument(
            "variable ", kVariableNames[i], " has shape ",
            t->shape().DebugString(), ", var has ", shape().DebugString());
      }
    }
    return ::tensorflow::OkStatus();
  }

  const TensorShape& shape() const { return vars_[0]->tensor()->shape(); }

  // Makes every buffer writable in place: one that another tensor still
  // shares is copied first (as TensorFlow's own training ops do).  `sparse`
  // (the row update) also puts the variables in copy-on-read mode, as every
  // TensorFlow sparse op (ResourceGather, ResourceScatter*) does; the dense
  // update leaves the mode alone, so that the dense reads of a Dense
  // layer's kernel keep sharing its buffer instead of copying it.  Then
  // data(i) may be written.
  template <typename T>
  Status PrepareToWrite(OpKernelContext* ctx, bool sparse) {
    for (int i = 0; i < 3; ++i) {
      Tensor* t = vars_[i]->tensor();
      if (!t->RefCountIsOne()) {
        Tensor copy;
        ::tensorflow::AllocatorAttributes attr;
        attr.set_gpu_compatible(true);
        attr.set_nic_compatible(true);
        TF_RETURN_IF_ERROR(
            ctx->allocate_temp(t->dtype(), t->shape(), &copy, attr));
        std::copy_n(t->flat<T>().data(), t->NumElements(),
                    copy.flat<T>().data());
        *t = copy;
      }
      if (sparse) vars_[i]->copy_on_read_mode.store(true);
    }
    return ::tensorflow::OkStatus();
  }

  template <typename T>
  T* data(int i) {
    return vars_[i]->tensor()->flat<T>().data();
  }

 private:
  std::array<::tensorflow::core::RefCountPtr<::tensorflow::Var>, 3> vars_;
  // Released before vars_ (members are destroyed in reverse order).
  std::array<std::optional<::tensorflow::mutex_lock>, 3> locks_;
};

}  // namespace

// ---------------------------------------------------------------------------
// CPU functors.

namespace functor {

template <typename T, typename Index>
struct SparseApplyAdam<CpuDevice, T, Index> {
  void operator()(OpKernelContext* ctx, const AdamStep<T>& step, const T* g,
                  const Index* ids, int64_t k, int64_t d, T* w, T* m,
                  T* v) const {
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, k, 12 * d,
        [&](int64_t start, int64_t limit) {
          for (int64_t r = start; r < limit; ++r) {
            const int64_t off = static_cast<int64_t>(ids[r]) * d;
            AdamRowUpdate<T>(step, g + r * d, w + off, m + off, v + off, d);
          }
        });
  }
};

template <typename T>
struct ApplyAdam<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const AdamStep<T>& step, const T* g,
                  int64_t n, T* w, T* m, T* v) const {
    // Blocks of kBlock elements, sharded over the thread pool.
    constexpr int64_t kBlock = 4096;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, (n + kBlock - 1) / kBlock,
        12 * kBlock, [&](int64_t start, int64_t limit) {
          for (int64_t b = start; b < limit; ++b) {
            const int64_t off = b * kBlock;
            AdamRowUpdate<T>(step, g + off, w + off, m + off, v + off,
                             std::min(kBlock, n - off));
          }
        });
  }
};

}  // namespace functor

// ---------------------------------------------------------------------------
// The op kernels (one class per op, templated on the device).

namespace {

// Inputs 3-6 (alpha, one_minus_beta1, one_minus_beta2, epsilon).
template <typename T>
Status ReadAdamStep(OpKernelContext* ctx, AdamStep<T>* step) {
  for (int i = 3; i < 7; ++i) {
    if (!::tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape())) {
      return errors::InvalidArgument(
          "alpha, one_minus_beta1, one_minus_beta2 and epsilon must be "
          "scalars, got shape ",
          ctx->input(i).shape().DebugString(), " for input ", i);
    }
  }
  step->alpha = ctx->input(3).scalar<T>()();
  step->one_minus_beta1 = ctx->input(4).scalar<T>()();
  step->one_minus_beta2 = ctx->input(5).scalar<T>()();
  step->epsilon = ctx->input(6).scalar<T>()();
  return ::tensorflow::OkStatus();
}

template <typename Device, typename T, typename Index>
class ResourceSparseApplyAdamOp : public OpKernel {
 public:
  explicit ResourceSparseApplyAdamOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(7);
    const Tensor& indices = ctx->input(8);
    AdamVariables vars;
    OP_REQUIRES_OK(ctx, vars.Init(ctx, grad.dtype()));
    const TensorShape& shape = vars.shape();
    OP_REQUIRES(ctx, shape.dims() >= 1,
                errors::InvalidArgument("var must have rank >= 1, got shape ",
                                        shape.DebugString()));
    AdamStep<T> step;
    OP_REQUIRES_OK(ctx, ReadAdamStep<T>(ctx, &step));
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsVector(indices.shape()),
                errors::InvalidArgument("indices must be a vector, got shape ",
                                        indices.shape().DebugString()));
    const int64_t k = indices.dim_size(0);
    TensorShape row_shape = shape;
    row_shape.RemoveDim(0);
    TensorShape want = row_shape;
    want.InsertDim(0, k);
    OP_REQUIRES(ctx, grad.shape() == want,
                errors::InvalidArgument(
                    "grad has shape ", grad.shape().DebugString(),
                    ", expected ", want.DebugString(),
                    " ([len(indices)] + var.shape[1:])"));
    OP_REQUIRES_OK(ctx, ValidateRowIds<Index>(indices, shape.dim_size(0)));
    if (k == 0 || row_shape.num_elements() == 0) return;
    OP_REQUIRES_OK(ctx, vars.PrepareToWrite<T>(ctx, /*sparse=*/true));

    functor::SparseApplyAdam<Device, T, Index>()(
        ctx, step, grad.flat<T>().data(), indices.flat<Index>().data(), k,
        row_shape.num_elements(), vars.data<T>(0), vars.data<T>(1),
        vars.data<T>(2));
  }
};

template <typename Device, typename T>
class ResourceApplyAdamOp : public OpKernel {
 public:
  explicit ResourceApplyAdamOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(7);
    AdamVariables vars;
    OP_REQUIRES_OK(ctx, vars.Init(ctx, grad.dtype()));
    OP_REQUIRES(ctx, grad.shape() == vars.shape(),
                errors::InvalidArgument(
                    "grad has shape ", grad.shape().DebugString(),
                    ", var has ", vars.shape().DebugString()));
    AdamStep<T> step;
    OP_REQUIRES_OK(ctx, ReadAdamStep<T>(ctx, &step));
    const int64_t n = grad.NumElements();
    if (n == 0) return;
    OP_REQUIRES_OK(ctx, vars.PrepareToWrite<T>(ctx, /*sparse=*/false));
    functor::ApplyAdam<Device, T>()(ctx, step, grad.flat<T>().data(), n,
                                    vars.data<T>(0), vars.data<T>(1),
                                    vars.data<T>(2));
  }
};

#define REGISTER_CPU(T, Index)                                   \
  REGISTER_KERNEL_BUILDER(Name("Xmc>ResourceSparseApplyAdam")    \
                              .Device(DEVICE_CPU)                \
                              .TypeConstraint<T>("T")            \
                              .TypeConstraint<Index>("Tindices"), \
                          ResourceSparseApplyAdamOp<CpuDevice, T, Index>);

REGISTER_CPU(float, int32_t);
REGISTER_CPU(float, int64_t);
REGISTER_CPU(double, int32_t);
REGISTER_CPU(double, int64_t);
#undef REGISTER_CPU

REGISTER_KERNEL_BUILDER(
    Name("Xmc>ResourceApplyAdam").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    ResourceApplyAdamOp<CpuDevice, float>);
REGISTER_KERNEL_BUILDER(
    Name("Xmc>ResourceApplyAdam").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    ResourceApplyAdamOp<CpuDevice, double>);

}  // namespace
}  // namespace xmc_tf
