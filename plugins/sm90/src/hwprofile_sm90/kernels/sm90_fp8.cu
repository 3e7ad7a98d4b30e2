// hwprofile-sm90: the FP8 (e4m3 weight, bf16 activation) GEMV for Hopper (H100, H200), built by NVRTC for sm_90a.
//
// Its own source, apart from kernels/sm90_gemv.cu, so that a change here re-measures only ops.fp8_gemv: a
// stamp digests the source its op's kernel is built from, and the bf16 ops' shipped tables stay tied to theirs.
//  * hwp90_gemv_simt at M = 1: the shared SIMT body (hwprofile/gemv.cuh), as the bf16 GEMV's small-N path
//    (split-K over a 2-block cluster, x streamed through shared memory in chunks for a long K).
//  * hwp90_skinny_mma at M = 2..16: the shared FP8 tensor-core body (hwprofile/skinny_fp8.cuh): each weight read
//    once for all M tokens, dequantised on the integer pipe. Not measured yet (benchmarks/run_h200.sh fp8m).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900)
#error "hwprofile-sm90 kernels are built for sm_90a only"
#endif
#include <hwprofile/gemv.cuh>
#include <hwprofile/skinny_fp8.cuh>

namespace hwp90f8 {
// Hopper limits these kernels rely on (compute capability 9.0; the same as kernels/sm90_gemv.cu's).
constexpr int kMaxStaticShared = 48 * 1024;  // static shared memory per block (no opt-in)
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxThreads = 1024;
}  // namespace hwp90f8

// Entry points. Name expressions (planned by hwprofile_sm90.planning.plan_gemv with fp8=True):
//   hwp90_gemv_simt<true, __nv_bfloat16, 1, WARPS, ROWS, KSPLIT, U, SCALE[, XCHUNK]>  M = 1; grid (ceil(N / (WARPS*ROWS)), KSPLIT),
//       dynamic shared memory = the staged x slice (checked against 227 KB by hwprofile.kernels.skinny_gemm.plan)
//   hwp90_skinny_mma<true, __nv_bfloat16, MT, WARPS, NT, KSPLIT, U, SCALE>  M = 2..16; grid (ceil(N / 8NT), KSPLIT)
template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE, int XCHUNK = 0>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp90_gemv_simt(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
                const float* __restrict__ scale, int /*M*/, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp90f8::kMaxPortableCluster, "portable cluster sizes on sm_90");
  static_assert(WARPS * 32 <= hwp90f8::kMaxThreads, "threads per block");
  static_assert(WARPS * ROWS * M * 4 <= hwp90f8::kMaxStaticShared, "static shared memory of the split-K reduction");
  extern __shared__ uint4 hwp90f8_xs[];
  hwp::simt_gemv<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE, XCHUNK>(out, x, w, scale, N, K, hwp90f8_xs);
}

template <bool FP8, typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp90_skinny_mma(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
                 const float* __restrict__ scale, int M, int N, int K) {
  static_assert(FP8, "sm90_fp8.cu serves the FP8 GEMV only (the fp32-output ops take hwp90_router)");
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp90f8::kMaxPortableCluster, "portable cluster sizes on sm_90");
  static_assert(WARPS * 32 <= hwp90f8::kMaxThreads, "threads per block");
  static_assert((WARPS * NT * 128 + NT * 128) * 4 <= hwp90f8::kMaxStaticShared, "static shared memory of the reduction");
  hwp::skinny_fp8<TOut, MT, WARPS, NT, KSPLIT, U, SCALE>(out, x, static_cast<const unsigned char*>(w), scale, M, N, K);
}
