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
// The limits they rely on are static_asserts below; the dynamic shared memory (the GEMV's staged x
// slice) is checked by the plan (hwprofile.skinny) against the same 227 KB.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1000) && (__CUDA_ARCH__ != 1030)
#error "hwprofile-sm100 kernels are built for sm_100a / sm_103a only"
#endif
#include <hwprofile/gemv.cuh>

namespace hwp100 {
// Compute capability 10.0 / 10.3 limits (CUDA C++ Programming Guide, technical specifications).
constexpr int kMaxSharedPerBlock = 227 * 1024;  // opt-in, static + dynamic
constexpr int kMaxStaticShared = 48 * 1024;     // without opt-in
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxThreads = 1024;
static_assert(kMaxStaticShared <= kMaxSharedPerBlock, "limits");
}  // namespace hwp100

// Entry points (name expressions planned by hwprofile.skinny with prefix "hwp100"):
//   hwp100_skinny_mma<FP8, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>  tensor cores, M <= 16; grid (ceil(N / 8NT), KSPLIT)
//   hwp100_gemv_simt<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE>  SIMT, M = 1; grid (ceil(N / (WARPS*ROWS)), KSPLIT),
//                                                                 dynamic shared memory = the staged x slice
template <bool FP8, typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp100_skinny_mma(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
               const float* __restrict__ scale, int M, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp100::kMaxPortableCluster, "portable cluster size");
  static_assert(WARPS * 32 <= hwp100::kMaxThreads, "threads per block");
  static_assert((WARPS * NT * 128 + NT * 128) * 4 <= hwp100::kMaxStaticShared, "static shared memory of the reduction");
  hwp::skinny_gemm<FP8, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>(out, x, w, scale, M, N, K);
}

template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp100_gemv_simt(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
              const float* __restrict__ scale, int /*M*/, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp100::kMaxPortableCluster, "portable cluster size");
  static_assert(WARPS * 32 <= hwp100::kMaxThreads, "threads per block");
  static_assert(WARPS * ROWS * M * 4 <= hwp100::kMaxStaticShared, "static shared memory of the split-K reduction");
  extern __shared__ uint4 hwp100_xs[];  // the plan caps it at hwp100::kMaxSharedPerBlock minus the static part
  hwp::simt_gemv<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE>(out, x, w, scale, N, K, hwp100_xs);
}
