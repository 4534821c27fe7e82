// Helpers of the framework-free CUDA launchers (*.cu.cc, compiled by nvcc
// alone: no TensorFlow header here, so tools/build_cuda_harness.py can build
// a launcher without TensorFlow).
//
// The launcher contract these implement (see each family's *_kernels.h):
// every launcher takes a device `error_scratch` of kSlots int64 (one slot
// per range-checked operand), enqueues its kernels on `stream`, copies the
// slots back, synchronises and returns a cudaError_t as int; on return
// bad_positions[s] = -1, or the smallest flat position of a bad entry of
// operand s (recorded on the device with RecordBad: atomicMin, so the
// result does not depend on the schedule; a bad entry is never used as an
// address).
//
//   return RunWithChecks<2>(error_scratch, bad_positions, stream, [&] {
//     MyKernel<<<Grid1d(CeilDiv(total, kThreads), cap), kThreads, 0,
//                stream>>>(..., error_scratch);
//     return cudaGetLastError();
//   });
#ifndef XMC_TF_OPS_COMMON_CUDA_LAUNCH_H_
#define XMC_TF_OPS_COMMON_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace xmc_tf {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kNoError = INT64_MAX;  // an empty error slot

__host__ __device__ inline int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Records `position` in an error slot (the smallest one wins).
__device__ __forceinline__ void RecordBad(int64_t* slot, int64_t position) {
  atomicMin(reinterpret_cast<long long*>(slot),
            static_cast<long long>(position));
}

template <int kSlots>
__global__ void InitErrorSlotsKernel(int64_t* error_scratch) {
  for (int s = 0; s < kSlots; ++s) error_scratch[s] = kNoError;
}

// *count = the multiprocessors of the current device.
inline cudaError_t MultiprocessorCount(int* count) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}

// *cap = blocks_per_sm * (multiprocessors of the current device): the upper
// bound of the grid-stride launches.
inline cudaError_t MaxBlocks(int64_t blocks_per_sm, int64_t* cap) {
  int num_sms = 0;
  const cudaError_t err = MultiprocessorCount(&num_sms);
  if (err != cudaSuccess) return err;
  *cap = static_cast<int64_t>(num_sms) * blocks_per_sm;
  return cudaSuccess;
}

// A 1-D grid of min(units, cap) blocks, at least 1.
inline unsigned Grid1d(int64_t units, int64_t cap) {
  const int64_t x = units < cap ? units : cap;
  return static_cast<unsigned>(x < 1 ? 1 : x);
}

// Resets the kSlots error slots, runs `enqueue` (returns cudaError_t),
// copies the slots back, synchronises `stream` and sets bad_positions[0 ..
// kSlots).  Returns a cudaError_t as int.
template <int kSlots, typename Enqueue>
int RunWithChecks(int64_t* error_scratch, int64_t* bad_positions,
                  cudaStream_t stream, const Enqueue& enqueue) {
  InitErrorSlotsKernel<kSlots><<<1, 1, 0, stream>>>(error_scratch);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  err = enqueue();
  if (err != cudaSuccess) return static_cast<int>(err);
  int64_t found[kSlots];
  err = cudaMemcpyAsync(found, error_scratch, sizeof(found),
                        cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  for (int s = 0; s < kSlots; ++s) {
    bad_positions[s] = found[s] == kNoError ? -1 : found[s];
  }
  return static_cast<int>(cudaSuccess);
}

}  // namespace cuda
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_CUDA_LAUNCH_H_
