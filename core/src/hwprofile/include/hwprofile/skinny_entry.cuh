// hwprofile shared device code: the __global__ entry points of the skinny-GEMM family
// (hwprofile/gemv.cuh's skinny_gemm and simt_gemv), written once for every SM that instantiates the
// family as it is. A plugin's source names its SM's limits (hwp::FamilyLimits below, or a struct of its own with
// the same four members) and invokes the macro once:
//
//   namespace hwp100 {
//   using Limits = hwp::FamilyLimits<227 * 1024>;  // opt-in shared memory per block
//   }  // namespace hwp100
//   HWP_SKINNY_GEMM_ENTRY_POINTS(hwp100, hwp100::Limits)
//
// which declares, with static_asserts against those limits:
//   <P>_skinny_mma<FP8, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>  tensor cores, M <= 16; grid (ceil(N / 8NT), KSPLIT)
//       (FP8 = true: hwprofile/skinny_fp8.cuh's body, the FP8 GEMV at M = 2..16)
//   <P>_gemv_simt<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE[, XCHUNK]>  SIMT, M = 1; grid (ceil(N / (WARPS*ROWS)), KSPLIT),
//       dynamic shared memory = the staged x slice, or (XCHUNK > 0) an x buffer of XCHUNK weight vectors per token
// <P> is the ArchTuning prefix the plan (hwprofile.kernels.skinny_gemm.plan) writes into its name
// expressions. Both take the kernels' common arguments (out, x, w, scale, M, N, K) and are clusters
// of KSPLIT blocks along grid.y. The dynamic shared memory (the GEMV's staged x slice) is not known
// at compile time: the plan checks it against ArchTuning.max_shared_bytes, the same limit.
#pragma once
#include <hwprofile/gemv.cuh>
#include <hwprofile/skinny_fp8.cuh>

namespace hwp {

// The limits of an SM the family serves as it is (CUDA C++ Programming Guide, technical specifications): 48 KB of
// static shared memory without opt-in, portable clusters of 8, 1024 threads a block on every SM from sm_90 on;
// only the opt-in shared memory per block differs, and a plugin names it (the same number as its ArchTuning).
template <int kSharedPerBlock>
struct FamilyLimits {
  static constexpr int kMaxSharedPerBlock = kSharedPerBlock;  // opt-in, static + dynamic
  static constexpr int kMaxStaticShared = 48 * 1024;          // without opt-in
  static constexpr int kMaxPortableCluster = 8;
  static constexpr int kMaxThreads = 1024;
};

// The limits every entry point relies on, checked once per instance.
template <class L, int WARPS, int KSPLIT>
__device__ __forceinline__ void check_entry_limits() {
  static_assert(L::kMaxStaticShared <= L::kMaxSharedPerBlock, "limits: static shared memory is part of the per-block total");
  static_assert(KSPLIT >= 1 && KSPLIT <= L::kMaxPortableCluster, "portable cluster size");
  static_assert(WARPS * 32 <= L::kMaxThreads, "threads per block");
}

template <class L, bool FP8, typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>
__device__ __forceinline__ void skinny_mma_entry(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                                 const void* __restrict__ w, const float* __restrict__ scale, int M, int N,
                                                 int K) {
  check_entry_limits<L, WARPS, KSPLIT>();
  static_assert((WARPS * NT * 128 + NT * 128) * 4 <= L::kMaxStaticShared, "static shared memory of the reduction");
  if constexpr (FP8)  // the FP8 GEMV at M = 2..16: hwprofile/skinny_fp8.cuh (integer-pipe dequantisation, NaN rows)
    skinny_fp8<TOut, MT, WARPS, NT, KSPLIT, U, SCALE>(out, x, static_cast<const unsigned char*>(w), scale, M, N, K);
  else
    skinny_gemm<false, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>(out, x, w, scale, M, N, K);
}

template <class L, bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE, int XCHUNK>
__device__ __forceinline__ void gemv_simt_entry(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                                const void* __restrict__ w, const float* __restrict__ scale, int N, int K,
                                                uint4* xs) {
  check_entry_limits<L, WARPS, KSPLIT>();
  static_assert(WARPS * ROWS * M * 4 <= L::kMaxStaticShared, "static shared memory of the split-K reduction");
  simt_gemv<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE, XCHUNK>(out, x, w, scale, N, K, xs);
}

}  // namespace hwp

// The two entry points named P##_skinny_mma and P##_gemv_simt, checked against the limits struct L.
#define HWP_SKINNY_GEMM_ENTRY_POINTS(P, L)                                                                          \
  template <bool FP8, typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>                      \
  __global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)                                     \
  P##_skinny_mma(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,           \
                 const float* __restrict__ scale, int M, int N, int K) {                                            \
    ::hwp::skinny_mma_entry<L, FP8, TOut, MT, WARPS, NT, KSPLIT, U, SCALE>(out, x, w, scale, M, N, K);              \
  }                                                                                                                 \
  template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE, int XCHUNK = 0>     \
  __global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)                                     \
  P##_gemv_simt(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,            \
                const float* __restrict__ scale, int /*M*/, int N, int K) {                                         \
    extern __shared__ uint4 P##_xs[]; /* the plan caps it at L::kMaxSharedPerBlock minus the static part */        \
    ::hwp::gemv_simt_entry<L, FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE, XCHUNK>(out, x, w, scale, N, K, P##_xs); \
  }
