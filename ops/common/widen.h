// The narrow floating types of the CPU kernels (Eigen::half,
// Eigen::bfloat16) are computed in float: a kernel widens a block of its
// input to float (exact) and runs its float code on it, so its results are
// those of the float kernel on the inputs' float32 values.  Framework-free
// (templated on the type: the .cc files instantiate it with Eigen's types).
#ifndef XMC_TF_OPS_COMMON_WIDEN_H_
#define XMC_TF_OPS_COMMON_WIDEN_H_

#include <cstdint>
#include <type_traits>
#include <vector>

namespace xmc_tf {

// The n values at x as floats: x itself when T is float, else converted
// into *buffer (resized to n) and buffer->data().
template <typename T>
const float* WidenToFloat(const T* x, int64_t n, std::vector<float>* buffer) {
  if constexpr (std::is_same<T, float>::value) {
    return x;
  } else {
    buffer->resize(n);
    for (int64_t j = 0; j < n; ++j) (*buffer)[j] = static_cast<float>(x[j]);
    return buffer->data();
  }
}

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_WIDEN_H_
