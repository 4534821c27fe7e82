// Input validation shared by the TensorFlow kernels of every op family: the
// common TensorFlow names of the kernel files (OpKernel, Tensor, Status, ...
// in namespace xmc_tf), rank / shape / scalar / dtype checks and the one
// "out of range" message.  TensorFlow-side only: the framework-free CUDA
// launchers (*.cu.cc) must not include this header.
//
// Every check returns an InvalidArgument Status (never crashes); the
// messages are the ones the op tests match, e.g.
//   CheckMatrix(t, "weights")   "weights must be a matrix (rank 2), got shape [3]"
//   CheckVector(t, "rows")      "rows must be a vector (rank 1), got shape [2,2]"
//   CheckScalar(t, "step")      "step must be a scalar, got shape [2]"
//   CheckRank(t, 3, "probs", "[batch, R, B]")
//                               "probs must have rank 3 [batch, R, B], got shape [2]"
//   NonNegativeScalar(t, "batch_size", &v)
//                               "batch_size must be a scalar, got shape [2]" /
//                               "batch_size must be >= 0, got -1"
//   CheckDtype(t, DT_FLOAT, "features")
//                               "features must be float, got double"
//   CheckSameShape(w, "weights", idx, "indices", "[num_labels, fan_in]")
//       "weights shape [3,3] must equal indices shape [3,2] ([num_labels, fan_in])"
//   CheckInt32Indexable(e, "num_features")
//                               "num_features = 3000000000 does not fit int32 indices"
//   OutOfRange("labels", labels.shape(), p, value, -1, m,
//              "num_labels; -1 is padding")
//       "labels[1, 2] = 7 is out of range [-1, 5) (num_labels; -1 is padding)"
//   (without a value, as the GPU kernels report it: "labels[1, 2] is out of
//   range [-1, 5) (...)").
#ifndef XMC_TF_OPS_COMMON_VALIDATION_H_
#define XMC_TF_OPS_COMMON_VALIDATION_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace xmc_tf {

// The TensorFlow names every kernel file uses (repeating a using-declaration
// at namespace scope is allowed, so a file may still declare its own).
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::DEVICE_GPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
namespace errors = ::tensorflow::errors;

// "<name> must be a matrix (rank 2), got shape <shape>".
inline Status CheckMatrix(const Tensor& t, const char* name) {
  if (t.dims() != 2) {
    return errors::InvalidArgument(name, " must be a matrix (rank 2), got shape ",
                                   t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// "<name> must be a vector (rank 1), got shape <shape>".
inline Status CheckVector(const Tensor& t, const char* name) {
  if (t.dims() != 1) {
    return errors::InvalidArgument(name, " must be a vector (rank 1), got shape ",
                                   t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// "<name> must have rank <rank> <layout>, got shape <shape>"; `layout`
// describes the dimensions, e.g. "[batch, R, B]".
inline Status CheckRank(const Tensor& t, int rank, const char* name,
                        const char* layout) {
  if (t.dims() != rank) {
    return errors::InvalidArgument(name, " must have rank ", rank, " ", layout,
                                   ", got shape ", t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// "<name> must be a scalar, got shape <shape>".
inline Status CheckScalar(const Tensor& t, const char* name) {
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument(name, " must be a scalar, got shape ",
                                   t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// `t` is an int64 scalar >= 0, stored in *value.
inline Status NonNegativeScalar(const Tensor& t, const char* name,
                                int64_t* value) {
  TF_RETURN_IF_ERROR(CheckScalar(t, name));
  *value = t.scalar<int64_t>()();
  if (*value < 0) {
    return errors::InvalidArgument(name, " must be >= 0, got ", *value);
  }
  return ::tensorflow::OkStatus();
}

// "<name> must be <dtype>, got <t's dtype>" (for operands whose dtype the op
// registration does not fix, e.g. a resource variable's buffer).
inline Status CheckDtype(const Tensor& t, ::tensorflow::DataType dtype,
                         const char* name) {
  if (t.dtype() != dtype) {
    return errors::InvalidArgument(name, " must be ",
                                   ::tensorflow::DataTypeString(dtype),
                                   ", got ",
                                   ::tensorflow::DataTypeString(t.dtype()));
  }
  return ::tensorflow::OkStatus();
}

// "<a_name> shape <a> must equal <b_name> shape <b> (<layout>)", e.g.
// weights vs indices "([num_labels, fan_in])".
inline Status CheckSameShape(const Tensor& a, const char* a_name,
                             const Tensor& b, const char* b_name,
                             const char* layout) {
  if (a.shape() != b.shape()) {
    return errors::InvalidArgument(a_name, " shape ", a.shape().DebugString(),
                                   " must equal ", b_name, " shape ",
                                   b.shape().DebugString(), " (", layout, ")");
  }
  return ::tensorflow::OkStatus();
}

// "<name> = <n> does not fit int32 indices" for a size that int32 ids index.
inline Status CheckInt32Indexable(int64_t n, const char* name) {
  if (n > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument(name, " = ", n,
                                   " does not fit int32 indices");
  }
  return ::tensorflow::OkStatus();
}

// "<name>[i, j, ...]": flat `position` of a tensor of `shape` as an index.
inline std::string EntryName(const char* name, const TensorShape& shape,
                             int64_t position) {
  const int rank = shape.dims();
  std::string index;
  if (rank <= 1) {
    index = absl::StrCat(position);
  } else {
    int64_t rest = position;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t size = shape.dim_size(d) > 0 ? shape.dim_size(d) : 1;
      const int64_t i = d == 0 ? rest : rest % size;
      index = d == rank - 1 ? absl::StrCat(i) : absl::StrCat(i, ", ", index);
      rest /= size;
    }
  }
  return absl::StrCat(name, "[", index, "]");
}

// The message of an entry outside [lo, hi):
//   "<name>[i, j] = <value> is out of range [lo, hi) (<note>)"
// `value` is omitted when absent (the GPU kernels know the position only),
// " (<note>)" when `note` is empty.  A caller may append more context.
inline std::string OutOfRangeMessage(const char* name, const TensorShape& shape,
                                     int64_t position,
                                     std::optional<int64_t> value, int64_t lo,
                                     int64_t hi, const char* note) {
  std::string message = EntryName(name, shape, position);
  if (value.has_value()) absl::StrAppend(&message, " = ", *value);
  absl::StrAppend(&message, " is out of range [", lo, ", ", hi, ")");
  if (note != nullptr && note[0] != '\0') {
    absl::StrAppend(&message, " (", note, ")");
  }
  return message;
}

// InvalidArgument with OutOfRangeMessage.
inline Status OutOfRange(const char* name, const TensorShape& shape,
                         int64_t position, std::optional<int64_t> value,
                         int64_t lo, int64_t hi, const char* note) {
  return errors::InvalidArgument(
      OutOfRangeMessage(name, shape, position, value, lo, hi, note));
}

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_VALIDATION_H_
