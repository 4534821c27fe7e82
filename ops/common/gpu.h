// The TensorFlow side of the GPU kernels: TensorFlow's CUDA stream of an
// OpKernelContext, a launcher's cudaError_t (as int) as a Status, and the
// call of a range-checking launcher (ops/common/cuda_launch.h) with its
// device scratch.  TensorFlow-side only; only with XMC_TF_WITH_CUDA (set by
// tools/build_ops.py and ops/BUILD when the *.cu.cc launchers are built).
//
//   int64_t bad[2];
//   OP_REQUIRES_OK(ctx, RunCheckedLauncher(ctx, "a sampled kernel", 2, bad,
//       [&](int64_t* error_scratch, int64_t* bad_positions, void* stream) {
//         return XmcSomethingGpuF32(..., error_scratch, bad_positions, stream);
//       }));
//   if (bad[0] >= 0) ... OutOfRange(...) (ops/common/validation.h)
#ifndef XMC_TF_OPS_COMMON_GPU_H_
#define XMC_TF_OPS_COMMON_GPU_H_

#if XMC_TF_WITH_CUDA

#include <cstdint>

#include "ops/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "xla/stream_executor/stream.h"

namespace xmc_tf {

// The cudaStream_t (as void*) TensorFlow runs this kernel on, or nullptr.
inline void* CudaStream(OpKernelContext* ctx) {
  auto* device_context = ctx->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) {
    return nullptr;
  }
  return device_context->stream()->platform_specific_handle().stream;
}

// OK for cudaSuccess (0), else Internal("xmc_tf: CUDA error <err> in <what>").
inline Status CudaStatus(int err, const char* what) {
  if (err == 0) return ::tensorflow::OkStatus();
  return errors::Internal("xmc_tf: CUDA error ", err, " in ", what);
}

// Calls launch(error_scratch, bad_positions, stream) on TensorFlow's stream
// with a device scratch of `num_slots` int64 (the launcher contract of
// ops/common/cuda_launch.h: it returns a cudaError_t as int and sets
// bad_positions[0 .. num_slots) to -1 or the smallest bad flat position of
// each checked operand).  Returns Internal for a missing stream or a CUDA
// error (`what` names the kernel: "a squared-hinge kernel"); bad positions
// are left to the caller.
template <typename Launch>
Status RunCheckedLauncher(OpKernelContext* ctx, const char* what,
                          int num_slots, int64_t* bad_positions,
                          const Launch& launch) {
  for (int s = 0; s < num_slots; ++s) bad_positions[s] = -1;
  void* stream = CudaStream(ctx);
  if (stream == nullptr) {
    return errors::Internal("xmc_tf: no CUDA stream for this GPU kernel");
  }
  Tensor scratch;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                        TensorShape({num_slots}), &scratch));
  return CudaStatus(
      launch(scratch.flat<int64_t>().data(), bad_positions, stream), what);
}

}  // namespace xmc_tf

#endif  // XMC_TF_WITH_CUDA

#endif  // XMC_TF_OPS_COMMON_GPU_H_
