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
// SM12x has about 99 KB of shared memory per block: the static parts are static_asserts below, and
// the plan (hwprofile.skinny, ArchTuning.max_shared_bytes = 99 KB) splits K over the cluster when
// the GEMV's staged x slice would not fit.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1200) && (__CUDA_ARCH__ != 1210)
#error "hwprofile-sm120 kernels are built for sm_120a / sm_121a only"
#endif
#include <hwprofile/gemv.cuh>

namespace hwp120 {
// Compute capability 12.0 / 12.1 limits (CUDA C++ Programming Guide, technical specifications).
constexpr int kMaxSharedPerBlock = 99 * 1024;  // opt-in, static + dynamic
constexpr int kMaxStaticShared = 48 * 1024;    // without opt-in
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxThreads = 1024;
static_assert(kMaxStaticShared <= kMaxSharedPerBlock, "limits");
}  // namespace hwp120

// Entry points (name expressions planned by hwprofile.skinny with prefix "hwp120"):
//   hwp120_skinny_mma<FP8, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>  tensor cores, M <= 16; grid (ceil(N / 8NT), KSPLIT)
//   hwp120_gemv_simt<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE>  SIMT, M = 1; grid (ceil(N / (WARPS*ROWS)), KSPLIT),
//                                                                 dynamic shared memory = the staged x slice
template <bool FP8, typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp120_skinny_mma(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
               const float* __restrict__ scale, int M, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp120::kMaxPortableCluster, "portable cluster size");
  static_assert(WARPS * 32 <= hwp120::kMaxThreads, "threads per block");
  static_assert((WARPS * NT * 128 + NT * 128) * 4 <= hwp120::kMaxStaticShared, "static shared memory of the reduction");
  hwp::skinny_gemm<FP8, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>(out, x, w, scale, M, N, K);
}

template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp120_gemv_simt(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
              const float* __restrict__ scale, int /*M*/, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp120::kMaxPortableCluster, "portable cluster size");
  static_assert(WARPS * 32 <= hwp120::kMaxThreads, "threads per block");
  static_assert(WARPS * ROWS * M * 4 <= hwp120::kMaxStaticShared, "static shared memory of the split-K reduction");
  extern __shared__ uint4 hwp120_xs[];  // the plan caps it at hwp120::kMaxSharedPerBlock minus the static part
  hwp::simt_gemv<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE>(out, x, w, scale, N, K, hwp120_xs);
}
