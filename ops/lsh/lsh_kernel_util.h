// TensorFlow-side checks shared by the LSH kernels (lsh_hash_kernels.cc,
// lsh_table_kernels.cc, lsh_sample_kernels.cc); the generic ones (ranks,
// first bad row) are in ops/common/.  Each returns InvalidArgument naming
// the offending value.  Not for the framework-free lsh_kernels.h.
#ifndef XMC_TF_OPS_LSH_LSH_KERNEL_UTIL_H_
#define XMC_TF_OPS_LSH_LSH_KERNEL_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#include "ops/common/validation.h"
#include "ops/lsh/lsh_kernels.h"

namespace xmc_tf {
namespace lsh {

inline absl::Status CheckInt32Size(int64_t n, const char* what) {
  if (n > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument(what, " = ", n,
                                   " does not fit the int32 ids of the tables");
  }
  return absl::OkStatus();
}

// The LSH kernels' message of an id outside [lo, hi):
//   "<name>[i, j] = <value> is not in [lo, hi) (<note>)"
// (the entry named by ops/common/validation.h EntryName).
inline absl::Status NotInRange(const char* name, const TensorShape& shape,
                               int64_t position, int64_t value, int64_t lo,
                               int64_t hi, absl::string_view note) {
  return errors::InvalidArgument(EntryName(name, shape, position), " = ",
                                 value, " is not in [", lo, ", ", hi, ") (",
                                 note, ")");
}

// num_features sizes nothing, but coordinates are int32 ids.
inline absl::Status CheckNumFeatures(int64_t num_features) {
  if (num_features < 1 || num_features > lsh::kMaxNumFeatures) {
    return errors::InvalidArgument(
        "num_features must be in [1, 2^31 - 1] (int32 coordinates), got ",
        num_features);
  }
  return absl::OkStatus();
}

// Index of the first entry of codes [n] not in [0, B), or -1.  A
// vectorised pass unless it finds one: with hi = min(B, 2^31) - 1, the sign
// bit of c | (hi - c) (in uint32) is set exactly when c < 0 or c > hi.
inline int64_t FirstCodeOutOfRange(const int32_t* codes, int64_t n,
                                   int64_t B) {
  const uint32_t hi =
      static_cast<uint32_t>(std::min<int64_t>(B, int64_t{1} << 31) - 1);
  uint32_t acc = 0;
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t c = static_cast<uint32_t>(codes[t]);
    acc |= c | (hi - c);
  }
  if (!(acc >> 31)) return -1;
  for (int64_t t = 0; t < n; ++t) {
    if (codes[t] < 0 || codes[t] > static_cast<int64_t>(hi)) return t;
  }
  return -1;
}

// Index of the first non-finite entry of a float array, or -1.
inline int64_t FirstNonFinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

// Shapes shared by the update and the query: offsets [L, B + 1], labels
// [L, m], codes [m, L].
inline absl::Status CheckTables(const Tensor& offsets, const Tensor& labels,
                                const Tensor& codes, int64_t* L, int64_t* B,
                                int64_t* m) {
  TF_RETURN_IF_ERROR(CheckRank(offsets, 2, "offsets", "[L, num_buckets + 1]"));
  TF_RETURN_IF_ERROR(CheckRank(labels, 2, "labels", "[L, num_labels]"));
  TF_RETURN_IF_ERROR(CheckRank(codes, 2, "codes", "[num_labels, L]"));
  *L = offsets.dim_size(0);
  *B = offsets.dim_size(1) - 1;
  *m = labels.dim_size(1);
  if (*B < 1) {
    return errors::InvalidArgument(
        "offsets must have num_buckets + 1 >= 2 columns, got shape ",
        offsets.shape().DebugString());
  }
  if (labels.dim_size(0) != *L) {
    return errors::InvalidArgument("labels.shape[0] must equal L = ", *L,
                                   " (offsets.shape[0]), got labels shape ",
                                   labels.shape().DebugString());
  }
  if (codes.dim_size(0) != *m || codes.dim_size(1) != *L) {
    return errors::InvalidArgument("codes shape ", codes.shape().DebugString(),
                                   " must be [num_labels, L] = [", *m, ", ", *L,
                                   "]");
  }
  return CheckInt32Size(*m, "num_labels");
}

}  // namespace lsh
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_LSH_LSH_KERNEL_UTIL_H_
