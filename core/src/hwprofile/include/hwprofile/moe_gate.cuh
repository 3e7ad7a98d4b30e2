// hwprofile shared device code: the fused MoE gate of ops.moe_gate, one launch per step.
//
// The gate is the router GEMM (bf16 hidden [M, K] x weight [N, K]^T -> fp32 logits [M, N], M <= 16)
// followed by the expert selection of every token (DeepSeek-V3 / Kimi-K2 / Qwen rules). The GEMM
// is a weight stream spread over many CTAs (one CTA, or one cluster of KSPLIT CTAs, per 8*NT
// experts), but a token's selection needs all N of its logits: so every CTA that owns logits
// writes them to global memory, fences, and counts itself on a counter in global memory; the CTA
// that counts last selects for every token (one warp per token) and resets the counter for the
// next launch. Why this cut and not the others (docs/kernels.md, "The fused MoE gate"):
//  * a single cluster (<= 8 portable, 16 non-portable CTAs) holding all logits in DSMEM would leave
//    the 3.7-5.5 MB weight stream to 8-16 of the 132 SMs, slower than the GEMM alone;
//  * one CTA per token reads the whole weight once per token;
//  * the last-CTA selection adds one atomic per CTA and the selection's own ~1 us at the end, and
//    keeps the GEMM's tiling exactly as measured.
// The counter is a device word of the caller's per-device workspace (one per stream: two launches
// on different streams never share one); it is zero between launches.
//
// Selection rules (those of hwprofile.ops._gate.select_torch):
//   score = sigmoid(logit) (flags & kSoftmax: softmax over the token's N logits);
//   choice = score + bias (no bias: score);
//   n_group > 1: a group's score is the sum of its two largest choice values (softmax: its largest);
//     the topk_group best groups stay (ties: the lower group), the other groups' experts are -inf;
//   the top_k largest choice values are picked in descending order (ties: the lower expert);
//   weight = the score of a picked expert, / (sum + 1e-20) if flags & kRenorm, * scaling.
// One warp per token: expert e is held by lane e % 32 at slot e / 32 (conflict-free shared-memory
// reads); MAX_N <= 1024 (a lane's taken-mask is one 32-bit word), n_group <= 32, top_k <= 32.
#pragma once
#include <hwprofile/skinny_entry.cuh>

namespace hwp {
namespace gate {

constexpr int kWarp = 32;
constexpr int kRenorm = 1;   // flags: normalise the picked weights
constexpr int kSoftmax = 2;  // flags: softmax scores instead of sigmoid
constexpr int kMaxSelectWarps = 8;

struct Args {
  long long* ids;        // [M, top_k] int64
  float* weights;        // [M, top_k] fp32
  const float* logits;   // [M, N] fp32, written by this grid's GEMM
  const float* bias;     // [N] fp32 or null
  unsigned* counter;     // zero between launches
  int M, N, n_group, topk_group, top_k, flags;
  float scaling;
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }  // NVRTC has no <cmath> INFINITY

// (value, index) order of a stable descending sort: a larger value first, equal values by the lower index
__device__ __forceinline__ bool before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// every lane gets lane 0's sum: a butterfly adds in a different order on each lane
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }  // torch's fp32 sigmoid, not __expf

// One token, one warp. choice: this warp's MAX_N floats of shared memory; gscore: its 32.
template <int MAX_N>
__device__ __forceinline__ void select_token(const Args& a, int m, float* choice, float* gscore) {
  static_assert(MAX_N % kWarp == 0 && MAX_N / kWarp <= 32, "a lane's taken-mask is one 32-bit word");
  constexpr int SLOTS = MAX_N / kWarp;
  const int lane = threadIdx.x & (kWarp - 1), N = a.N;
  const float* row = a.logits + static_cast<size_t>(m) * N;
  float sc[SLOTS];  // this lane's scores: expert lane + 32 s
  float mx = neg_inf();
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int e = lane + kWarp * s;
    sc[s] = e < N ? __ldcg(row + e) : neg_inf();  // L2: other CTAs wrote them
    mx = fmaxf(mx, sc[s]);
  }
  if (a.flags & kSoftmax) {
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      sc[s] = lane + kWarp * s < N ? expf(sc[s] - mx) : 0.f;
      sum += sc[s];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) sc[s] = sc[s] / sum;
  } else {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) sc[s] = sigmoid(sc[s]);
  }
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int e = lane + kWarp * s;
    if (e < N) choice[e] = a.bias != nullptr ? sc[s] + __ldg(a.bias + e) : sc[s];
  }
  __syncwarp();

  if (a.n_group > 1) {  // lane g scores group g
    const int per = N / a.n_group;
    if (lane < a.n_group) {
      float b1 = neg_inf(), b2 = neg_inf();  // the two largest of the group (values only: their order cannot change the sum)
      for (int j = 0; j < per; ++j) {
        const float v = choice[lane * per + j];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gscore[lane] = (a.flags & kSoftmax) ? b1 : b1 + b2;
    }
    __syncwarp();
    const float gv = lane < a.n_group ? gscore[lane] : neg_inf();
    bool kept = false;
    for (int r = 0; r < a.topk_group; ++r) {
      float v = lane < a.n_group && !kept ? gv : neg_inf();
      int i = lane < a.n_group && !kept ? lane : 0x7fffffff;
      warp_best(v, i);
      kept = kept || lane == i;
    }
    const unsigned keep = __ballot_sync(0xffffffffu, kept);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int e = lane + kWarp * s;
      if (e < N && !((keep >> (e / per)) & 1u)) choice[e] = neg_inf();
    }
    __syncwarp();
  }

  unsigned taken = 0u;  // bit s: this lane's expert lane + 32 s is picked
  float picked = 0.f, sum = 0.f;
  long long* ids = a.ids + static_cast<size_t>(m) * a.top_k;
  for (int r = 0; r < a.top_k; ++r) {
    float v = neg_inf();
    int i = 0x7fffffff;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int e = lane + kWarp * s;
      if (e < N && !((taken >> s) & 1u) && before(choice[e], e, v, i)) {
        v = choice[e];
        i = e;
      }
    }
    warp_best(v, i);
    const int owner = i & (kWarp - 1), slot = i / kWarp;
    float mine = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) mine = s == slot ? sc[s] : mine;  // no dynamic register indexing
    if (owner == lane) taken |= 1u << slot;
    const float w = __shfl_sync(0xffffffffu, mine, owner);
    sum += w;  // in pick order, every lane the same
    if (lane == r) {
      picked = w;
      ids[r] = i;
    }
  }
  if (lane < a.top_k) {
    float w = picked;
    if (a.flags & kRenorm) w = w / (sum + 1e-20f);
    if (a.scaling != 1.0f) w = w * a.scaling;
    a.weights[static_cast<size_t>(m) * a.top_k + lane] = w;
  }
  __syncwarp();  // choice is reused by this warp's next token
}

// After this CTA stored its logits: count it; the CTA that counts last (of `ctas`) selects for every
// token with SELW warps, then resets the counter. Every thread of the CTA calls it.
template <int MAX_N, int SELW>
__device__ __forceinline__ void select_when_last(const Args& a, unsigned ctas) {
  __shared__ float choice[SELW][MAX_N];
  __shared__ float gscore[SELW][kWarp];
  __shared__ int last;
  __threadfence();  // this thread's logits are visible device-wide before the CTA counts itself
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1u) == ctas - 1u;
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire: every other CTA's logits (read through L2 by select_token)
  const int warp = threadIdx.x / kWarp;
  if (warp < SELW)
    for (int m = warp; m < a.M; m += SELW) select_token<MAX_N>(a, m, choice[warp], gscore[warp]);
  if (threadIdx.x == 0) atomicExch(a.counter, 0u);  // the next launch starts after this grid ends (stream order, PDL's wait)
}

template <int WARPS>
struct SelectWarps {
  static constexpr int value = WARPS < kMaxSelectWarps ? WARPS : kMaxSelectWarps;
};

// The Blackwell-class body: the skinny-GEMM family's tensor-core GEMM (hwprofile/gemv.cuh) into the
// logits, then the selection by the last CTA. L: the SM's limits (hwprofile/skinny_entry.cuh).
template <class L, int MT, int WARPS, int NT, int KSPLIT, int U, int MAX_N>
__device__ __forceinline__ void skinny_gate(const Args& a, float* logits, const __nv_bfloat16* x, const void* w, int K) {
  check_entry_limits<L, WARPS, KSPLIT>();
  constexpr int SELW = SelectWarps<WARPS>::value;
  static_assert((WARPS * NT * 128 + NT * 128) * 4 + SELW * (MAX_N + kWarp) * 4 + 4 <= L::kMaxStaticShared,
                "static shared memory of the reduction and the selection");
  skinny_gemm<false, float, MT, WARPS, NT, KSPLIT, U, kNoScale>(logits, x, w, nullptr, a.M, a.N, K);
  if (KSPLIT > 1 && cluster_rank() != 0) return;  // rank 0 of each cluster stored its block of logits
  select_when_last<MAX_N, SELW>(a, gridDim.x);
}

}  // namespace gate
}  // namespace hwp

// The fused gate entry point P##_moe_gate<MT, WARPS, NT, KSPLIT, U, MAX_N> of a Blackwell-class plugin,
// grid (ceil(N / 8NT), KSPLIT) as the family's P##_skinny_mma, checked against the limits struct L.
// ABI (hwprofile.ops._gate.ARG_TYPES): ids, weights, logits, counter, x, w, bias, M, N, K, n_group,
// topk_group, top_k, flags, scaling.
#define HWP_MOE_GATE_ENTRY_POINT(P, L)                                                                                         \
  template <int MT, int WARPS, int NT, int KSPLIT, int U, int MAX_N>                                                           \
  __global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)                                                 \
  P##_moe_gate(long long* __restrict__ ids, float* __restrict__ weights, float* logits, unsigned* counter,                     \
               const __nv_bfloat16* __restrict__ x, const void* __restrict__ w, const float* __restrict__ bias, int M, int N,  \
               int K, int n_group, int topk_group, int top_k, int flags, float scaling) {                                      \
    const ::hwp::gate::Args a{ids, weights, logits, bias, counter, M, N, n_group, topk_group, top_k, flags, scaling};         \
    ::hwp::gate::skinny_gate<L, MT, WARPS, NT, KSPLIT, U, MAX_N>(a, logits, x, w, K);                                           \
  }
