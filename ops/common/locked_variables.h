// Resource variables that a kernel writes in place (the fused update of the
// uniform-sparse head, the in-place SET rewire): looked up, checked, held
// under exclusive locks taken in address order (no deadlock with another op
// locking the same variables), and made writable the way TensorFlow's dense
// training ops do (a buffer that another tensor still shares is copied
// first; the variables are not put in copy-on-read mode, so the dense reads
// of a layer's forward keep sharing the buffer).
//
// Header-only, TensorFlow-side (not for the nvcc launchers).
#ifndef XMC_TF_OPS_COMMON_LOCKED_VARIABLES_H_
#define XMC_TF_OPS_COMMON_LOCKED_VARIABLES_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/mutex.h"

namespace xmc_tf {

class LockedVariables {
 public:
  // Looks up the resource inputs first..first+n-1 (names[i] names input
  // first+i in messages) and checks: distinct, initialised, of `shape`, and
  // of dtypes[i] (DT_INVALID: any dtype).
  ::tensorflow::Status Init(
      ::tensorflow::OpKernelContext* ctx, int first, int n,
      const std::vector<std::string>& names,
      const std::vector<::tensorflow::DataType>& dtypes,
      const ::tensorflow::TensorShape& shape) {
    namespace errors = ::tensorflow::errors;
    vars_.resize(n);
    for (int i = 0; i < n; ++i) {
      TF_RETURN_IF_ERROR(::tensorflow::LookupResource(
          ctx, ::tensorflow::HandleFromInput(ctx, first + i), &vars_[i]));
    }
    std::vector<::tensorflow::Var*> order;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < i; ++j) {
        if (vars_[i].get() == vars_[j].get()) {
          return errors::InvalidArgument(names[j], " and ", names[i],
                                         " are the same variable");
        }
      }
      order.push_back(vars_[i].get());
    }
    std::sort(order.begin(), order.end(), std::less<::tensorflow::Var*>());
    locks_.resize(n);
    for (int i = 0; i < n; ++i) locks_[i].emplace(*order[i]->mu());
    for (int i = 0; i < n; ++i) {
      const ::tensorflow::Tensor* t = vars_[i]->tensor();
      if (!vars_[i]->is_initialized || !t->IsInitialized()) {
        return errors::FailedPrecondition("variable ", names[i],
                                          " is not initialized");
      }
      if (dtypes[i] != ::tensorflow::DT_INVALID && t->dtype() != dtypes[i]) {
        return errors::InvalidArgument(
            "variable ", names[i], " has dtype ",
            ::tensorflow::DataTypeString(t->dtype()), ", expected ",
            ::tensorflow::DataTypeString(dtypes[i]));
      }
      if (t->shape() != shape) {
        return errors::InvalidArgument(
            "variable ", names[i], " has shape ", t->shape().DebugString(),
            ", expected ", shape.DebugString(), " ([num_labels, fan_in])");
      }
    }
    return ::tensorflow::OkStatus();
  }

  // Copies every buffer that another tensor still shares, so that data(i)
  // may be written in place (TensorFlow's PrepareToUpdateVariable, dense
  // mode).
  ::tensorflow::Status PrepareToWrite(::tensorflow::OpKernelContext* ctx) {
    for (auto& var : vars_) {
      ::tensorflow::Tensor* t = var->tensor();
      if (t->RefCountIsOne()) continue;
      ::tensorflow::Tensor copy;
      ::tensorflow::AllocatorAttributes attr;
      attr.set_gpu_compatible(true);
      TF_RETURN_IF_ERROR(
          ctx->allocate_temp(t->dtype(), t->shape(), &copy, attr));
      const auto from = t->tensor_data();
      std::memcpy(const_cast<char*>(copy.tensor_data().data()), from.data(),
                  from.size());
      *t = copy;
    }
    return ::tensorflow::OkStatus();
  }

  ::tensorflow::Tensor* tensor(int i) { return vars_[i]->tensor(); }

  template <typename T>
  T* data(int i) {
    return vars_[i]->tensor()->flat<T>().data();
  }

 private:
  std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> vars_;
  // Released before vars_ (members are destroyed in reverse order).
  std::vector<std::optional<::tensorflow::mutex_lock>> locks_;
};

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_LOCKED_VARIABLES_H_
