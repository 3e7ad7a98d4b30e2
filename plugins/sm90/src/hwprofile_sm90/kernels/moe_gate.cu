// hwprofile-sm90: the fused MoE gate of ops.moe_gate (router GEMM + expert selection in one launch), built by NVRTC.
//
// The GEMM is exactly the router GEMM of sm90_gemv.cu (hwp90::router: mma.sync tiles, K split over
// the block's warps and a cluster of up to 8 blocks, the weights prefetched into L2 before
// griddepcontrol.wait, ranks pushing their partials into rank 0 with st.async), included rather than
// copied, so the GEMM half of the gate is the measured router kernel; it writes the fp32 logits, and
// the CTA that draws the last ticket selects the experts of every token (hwprofile/moe_gate.cuh says
// why this cut, and the rules). Launched with programmatic dependent launch, as the router GEMM: the
// blocks start while the previous kernel on the stream finishes and wait before reading anything.
// sm90_gemv.cu itself is not changed by this file (its digest is in every shipped threshold's stamp).
#include "sm90_gemv.cu"
#include <hwprofile/moe_gate.cuh>

// Entry point: hwp90_moe_gate<MT, WARPS, NT, KSPLIT, U, PF, MINB, MAX_N>, grid (ceil(N / 8NT), KSPLIT) as hwp90_router,
// block WARPS*32. ids [M, top_k] int64, weights [M, top_k] fp32, logits [M, N] fp32 (scratch the GEMM writes),
// counter: a zero device word, x [M, K] bf16, w [N, K] bf16, bias [N] fp32 or null. M <= 16, N <= MAX_N,
// top_k <= 32, n_group <= 32 dividing N (hwprofile_sm90.moe_gate checks every bound before launching).
template <int MT, int WARPS, int NT, int KSPLIT, int U, bool PF, int MINB, int MAX_N>
__global__ void __launch_bounds__(WARPS * 32, MINB) __cluster_dims__(1, KSPLIT, 1)
hwp90_moe_gate(long long* __restrict__ ids, float* __restrict__ weights, float* logits, unsigned* counter,
               const __nv_bfloat16* __restrict__ x, const void* __restrict__ w, const float* __restrict__ bias, int M, int N, int K,
               int n_group, int topk_group, int top_k, int flags, float scaling) {
  static_assert(MINB >= 1 && MINB * WARPS * 32 <= 2048, "at most 2048 threads per SM on sm_90");
  constexpr int TILE = NT * 128, INBOX = KSPLIT > 1 ? (KSPLIT - 1) * TILE : 1;
  static_assert((WARPS * TILE + INBOX + TILE) * 4 + 8 + 4 <= hwp90::kMaxStaticShared,
                "static shared memory of the router GEMM and the ticket");
  hwp90::router<MT, WARPS, NT, KSPLIT, U, PF, true>(logits, x, static_cast<const __nv_bfloat16*>(w), M, N, K);
  if (KSPLIT > 1 && hwp::cluster_rank() != 0) return;  // ranks 1.. pushed their partials into rank 0 and are done
  const hwp::gate::Args a{ids, weights, logits, bias, counter, M, N, n_group, topk_group, top_k, flags, scaling};
  hwp::gate::select_when_last<MAX_N>(a, gridDim.x);
}
