// hwprofile-sm100: skinny GEMM / GEMV kernels for Blackwell datacenter GPUs (B200, GB200: sm_100a;
// B300, GB300: sm_103a), built by NVRTC for exactly those targets. Compiled in CI, not yet run on
// such a GPU: the structure and tile constants are the ones measured on the H200, not tuned here.
//
// What they use, and why:
//  * mma.sync m16n8k16 (bf16 in, fp32 accumulate) for the router GEMM and the small-M linear: at
//    M <= 16 the tensor-core work per weight byte is tiny, so tcgen05/TMEM (built for large tiles)
//    would add set-up, not speed: the op is a weight stream bound by HBM;
//  * SIMT FMAs with row-contiguous 16-byte loads for the M = 1 GEMVs, e4m3 -> f16 by the hardware
//    converter for FP8 weights;
//  * thread-block clusters of up to 8 blocks (portable on sm_100) with distributed shared memory
//    for split-K, so a small N still spreads over the 148 SMs.
// The entry points hwp100_skinny_mma and hwp100_gemv_simt are hwprofile/skinny_entry.cuh's, with
// static_asserts against the limits below; the dynamic shared memory (the GEMV's x slice, staged
// whole up to 32 KB and streamed through two 8 KB buffers past that) is checked by the plan
// (hwprofile.kernels.skinny_gemm, ArchTuning prefix "hwp100") against the same 227 KB.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1000) && (__CUDA_ARCH__ != 1030)
#error "hwprofile-sm100 kernels are built for sm_100a / sm_103a only"
#endif
#include <hwprofile/skinny_entry.cuh>
#include <hwprofile/moe_gate.cuh>

namespace hwp100 {
// Compute capability 10.0 / 10.3 limits (CUDA C++ Programming Guide, technical specifications).
struct Limits {
  static constexpr int kMaxSharedPerBlock = 227 * 1024;  // opt-in, static + dynamic
  static constexpr int kMaxStaticShared = 48 * 1024;     // without opt-in
  static constexpr int kMaxPortableCluster = 8;
  static constexpr int kMaxThreads = 1024;
};
}  // namespace hwp100

HWP_SKINNY_GEMM_ENTRY_POINTS(hwp100, hwp100::Limits)
HWP_MOE_GATE_ENTRY_POINT(hwp100, hwp100::Limits)  // ops.moe_gate: the family's GEMM + the selection, one launch
