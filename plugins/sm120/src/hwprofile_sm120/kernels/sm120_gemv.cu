// hwprofile-sm120: skinny GEMM / GEMV kernels for Blackwell workstation and desktop GPUs (RTX PRO
// 6000, RTX 5090: sm_120a; DGX Spark GB10: sm_121a), built by NVRTC for exactly those targets.
// Compiled in CI, not yet run on such a GPU: the structure and tile constants are the ones
// measured on the H200, not tuned here.
//
// What they use, and why:
//  * mma.sync m16n8k16 (bf16 in, fp32 accumulate) for the router GEMM and the small-M linear:
//    SM12x has no tcgen05/TMEM, and warp-level mma.sync is its tensor-core path;
//  * SIMT FMAs with row-contiguous 16-byte loads for the M = 1 GEMVs, e4m3 -> f16 by the hardware
//    converter (sm_89 and later) for FP8 weights;
//  * thread-block clusters of up to 8 blocks with distributed shared memory for split-K (SM12x
//    supports clusters; 8 is the portable size), so a small N spreads over the SMs (188 on the RTX
//    PRO 6000, 48 on DGX Spark).
// The entry points hwp120_skinny_mma and hwp120_gemv_simt are hwprofile/skinny_entry.cuh's, with
// static_asserts against the limits below. SM12x has about 99 KB of shared memory per block: the
// plan (hwprofile.kernels.skinny_gemm, ArchTuning prefix "hwp120", max_shared_bytes = 99 KB, or less
// where the device reports less) stages the GEMV's x slice whole up to 32 KB and streams it through
// two 8 KB buffers in chunks past that, so no K is too long for the shared memory.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1200) && (__CUDA_ARCH__ != 1210)
#error "hwprofile-sm120 kernels are built for sm_120a / sm_121a only"
#endif
#include <hwprofile/skinny_entry.cuh>
#include <hwprofile/moe_gate.cuh>

namespace hwp120 {
// Compute capability 12.0 / 12.1 limits (CUDA C++ Programming Guide, technical specifications).
struct Limits {
  static constexpr int kMaxSharedPerBlock = 99 * 1024;  // opt-in, static + dynamic
  static constexpr int kMaxStaticShared = 48 * 1024;    // without opt-in
  static constexpr int kMaxPortableCluster = 8;
  static constexpr int kMaxThreads = 1024;
};
}  // namespace hwp120

HWP_SKINNY_GEMM_ENTRY_POINTS(hwp120, hwp120::Limits)
HWP_MOE_GATE_ENTRY_POINT(hwp120, hwp120::Limits)  // ops.moe_gate: the family's GEMM + the selection, one launch
