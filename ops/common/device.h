// The device tags of the op kernels (framework-free: included by the
// *_kernels.h functor declarations, which the nvcc launchers include too).
//
// Each op has one OpKernel class templated on the device, e.g.
//   template <typename Device, typename T> class FooOp : public OpKernel
// that reads, validates and allocates, then calls functor::Foo<Device, T>
// (declared once in the family's *_kernels.h; the CpuDevice specialisation
// in *_kernels.cc, the GpuDevice one, behind XMC_TF_WITH_CUDA, calling the
// extern "C" launchers of *_kernels.cu.cc).  Tags instead of Eigen's
// ThreadPoolDevice / GpuDevice: the g++ side then needs no CUDA headers, and
// the CPU functors use TensorFlow's intra-op pool from the OpKernelContext.
#ifndef XMC_TF_OPS_COMMON_DEVICE_H_
#define XMC_TF_OPS_COMMON_DEVICE_H_

namespace tensorflow {
class OpKernelContext;
}  // namespace tensorflow

namespace xmc_tf {

struct CpuDevice {};
struct GpuDevice {};

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_DEVICE_H_
