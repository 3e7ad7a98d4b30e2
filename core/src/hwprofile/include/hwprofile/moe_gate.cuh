// hwprofile shared device code: the fused MoE gate of ops.moe_gate, one launch per step.
//
// The gate is the router GEMM (bf16 hidden [M, K] x weight [N, K]^T -> fp32 logits [M, N], M <= 16)
// followed by the expert selection of every token (DeepSeek-V3 / Kimi-K2 / Qwen rules). The GEMM
// is a weight stream spread over many CTAs (one CTA, or one cluster of KSPLIT CTAs, per 8*NT
// experts), but a token's selection needs all N of its logits: so every CTA that owns logits
// stores them, synchronises, and one thread counts the CTA on a ticket in global memory with a
// single acquire-release atomic; the CTA that draws the last ticket selects for every token (one
// warp per token, every warp of the block) straight from L2. Why this cut and not the others
// (docs/kernels.md, "The fused MoE gate"):
//  * a single cluster (<= 8 portable, 16 non-portable CTAs) holding all logits in DSMEM would leave
//    the 3.7-5.5 MB weight stream to 8-16 of the 132 SMs, slower than the GEMM alone;
//  * one CTA per token reads the whole weight once per token;
//  * a partial top-k per CTA merged by the last one saves nothing: a CTA holds 8-16 experts of a
//    token, fewer than top_k or a group, so the merge would see as many candidates as logits.
// Ordering costs one `atom.acq_rel.gpu` per CTA (thread 0, after the CTA's barrier: the release
// covers the CTA's stores, the acquire of the last CTA covers every other CTA's), no per-thread
// fence and no reset: the ticket is `atom.inc` modulo the number of CTAs, so the last CTA's own
// increment returns the word to zero, and the word is zero between launches without a store of its
// own. The word belongs to the caller's per-device workspace (one per stream and one per captured
// launch: two launches that may run at once never share one).
//
// Selection rules (those of hwprofile.ops._gate.select_torch):
//   score = sigmoid(logit) (flags & kSoftmax: softmax over the token's N logits);
//   choice = score + bias (no bias: score);
//   n_group > 1: a group's score is the sum of its two largest choice values (softmax: its largest);
//     the topk_group best groups stay (ties: the lower group), the other groups' experts are -inf;
//   the top_k largest choice values are picked in descending order (ties: the lower expert);
//   weight = the score of a picked expert, / (sum + 1e-20) if flags & kRenorm, * scaling.
// One warp per token, experts held lane-contiguously: lane l holds experts l*S .. l*S+S-1 in
// registers (S <= SLOTS = MAX_N / 32, a runtime width), so the expert order is (lane, slot) order
// and every arg-max is a `redux.sync` max of an order-preserving 32-bit key plus a ballot: the
// lowest lane holding the maximum, and in it the lowest slot, is the lowest expert. With groups,
// S is chosen so that a group is LPG whole lanes (LPG a power of two: a group's top two are merged
// in log2(LPG) shuffles); a group count with no such width takes a per-group warp reduction.
// MAX_N <= 1024 (a lane's taken-mask is one 32-bit word), n_group <= 32, top_k <= 32.
#pragma once
#include <hwprofile/skinny_entry.cuh>

namespace hwp {
namespace gate {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kRenorm = 1;   // flags: normalise the picked weights
constexpr int kSoftmax = 2;  // flags: softmax scores instead of sigmoid

struct Args {
  long long* ids;        // [M, top_k] int64
  float* weights;        // [M, top_k] fp32
  const float* logits;   // [M, N] fp32, written by this grid's GEMM
  const float* bias;     // [N] fp32 or null
  unsigned* counter;     // the ticket: zero between launches
  int M, N, n_group, topk_group, top_k, flags;
  float scaling;
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }  // NVRTC has no <cmath> INFINITY

// An order-preserving key of a float: a larger value has a larger key (-0.0 counts as +0.0, as the float compare
// has it); every float's key is >= 1, so 0 is an empty or taken slot, below -inf.
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v + 0.0f);
  return max((b & 0x80000000u) ? ~b : (b | 0x80000000u), 1u);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// every lane gets lane 0's sum: a butterfly adds in a different order on each lane
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return __shfl_sync(kFull, v, 0);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }  // torch's fp32 sigmoid, not __expf

// (b1, b2): the two largest values pushed so far (values only: their order cannot change the sum b1 + b2)
__device__ __forceinline__ void top2_push(float v, float& b1, float& b2) {
  if (v > b1) {
    b2 = b1;
    b1 = v;
  } else if (v > b2) {
    b2 = v;
  }
}

// The warp's layout of a token's experts: lane l holds experts l*S .. l*S+S-1. With groups, the smallest power of two
// LPG of lanes per group whose width S = per / LPG fits SLOTS (a group is then LPG whole lanes, groups aligned to
// LPG); lpg 0: no such width, S = ceil(N / 32) and groups cut across lanes.
struct Layout {
  int S, lpg;
};

template <int SLOTS>
__device__ __forceinline__ Layout layout(int N, int n_group) {
  if (n_group > 1) {
    const int per = N / n_group;
    for (int lpg = 1; n_group * lpg <= kWarp; lpg *= 2)
      if (per % lpg == 0 && per / lpg <= SLOTS) return Layout{per / lpg, lpg};
  }
  return Layout{(N + kWarp - 1) / kWarp, 0};
}

// The scores of the groups, lane g holding group g's (-inf past n_group). ch: this lane's choice values.
template <int SLOTS>
__device__ __forceinline__ float group_scores(const Args& a, const float (&ch)[SLOTS], int lane, int e0, int S, int lpg) {
  const bool top1 = a.flags & kSoftmax;
  const int per = a.N / a.n_group;
  float gs = neg_inf();
  if (lpg > 0) {  // this lane's top two, merged over the group's lpg lanes (xor partners stay inside an aligned group)
    float b1 = neg_inf(), b2 = neg_inf();
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
      if (s < S && e0 + s < a.N) top2_push(ch[s], b1, b2);
    for (int o = 1; o < lpg; o <<= 1) {
      const float o1 = __shfl_xor_sync(kFull, b1, o), o2 = __shfl_xor_sync(kFull, b2, o);
      top2_push(o1, b1, b2);
      top2_push(o2, b1, b2);
    }
    const float mine = top1 ? b1 : b1 + b2;
    const float g = __shfl_sync(kFull, mine, min(lane, a.n_group - 1) * lpg);
    gs = lane < a.n_group ? g : neg_inf();
  } else {  // groups cut across lanes: one warp reduction of (top, second) per group
    for (int g = 0; g < a.n_group; ++g) {
      float b1 = neg_inf(), b2 = neg_inf();
#pragma unroll
      for (int s = 0; s < SLOTS; ++s)
        if (s < S && e0 + s < a.N && (e0 + s) / per == g) top2_push(ch[s], b1, b2);
#pragma unroll
      for (int o = kWarp / 2; o > 0; o >>= 1) {
        const float o1 = __shfl_xor_sync(kFull, b1, o), o2 = __shfl_xor_sync(kFull, b2, o);
        top2_push(o1, b1, b2);
        top2_push(o2, b1, b2);
      }
      if (lane == g) gs = top1 ? b1 : b1 + b2;
    }
  }
  return gs;
}

// One token, one warp (every lane calls it). S, lpg: the layout (the same for every token of the launch).
template <int SLOTS>
__device__ __forceinline__ void select_token(const Args& a, int m, int S, int lpg) {
  static_assert(SLOTS >= 1 && SLOTS <= 32, "a lane holds at most 32 experts");
  const int lane = threadIdx.x & (kWarp - 1), N = a.N, e0 = lane * S;
  const float* row = a.logits + static_cast<size_t>(m) * N;
  float sc[SLOTS], ch[SLOTS];
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {  // every load in flight before any use
    const bool ok = s < S && e0 + s < N;
    sc[s] = ok ? __ldcg(row + e0 + s) : neg_inf();  // L2: other CTAs wrote them
    ch[s] = ok && a.bias != nullptr ? __ldg(a.bias + e0 + s) : 0.f;
  }
  if (a.flags & kSoftmax) {
    float mx = neg_inf();
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) mx = fmaxf(mx, sc[s]);
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      sc[s] = s < S && e0 + s < N ? expf(sc[s] - mx) : 0.f;
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
  for (int s = 0; s < SLOTS; ++s) ch[s] = a.bias != nullptr ? sc[s] + ch[s] : sc[s];

  if (a.n_group > 1) {
    const float gs = group_scores<SLOTS>(a, ch, lane, e0, S, lpg);
    unsigned gk = lane < a.n_group ? order_key(gs) : 0u, keep = 0u;
    for (int r = 0; r < a.topk_group; ++r) {  // the best group left; ties: the lowest lane, the lower group
      const unsigned best = __reduce_max_sync(kFull, gk);
      const int g = __ffs(__ballot_sync(kFull, gk == best)) - 1;
      keep |= 1u << g;
      if (lane == g) gk = 0u;
    }
    const int per = N / a.n_group, mine = lpg > 0 ? lane / lpg : 0;  // aligned: every expert of this lane is in group lane / lpg
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
      if (s < S && e0 + s < N && !((keep >> (lpg > 0 ? mine : (e0 + s) / per)) & 1u)) ch[s] = neg_inf();  // other groups' out
  }

  unsigned key[SLOTS];
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) key[s] = s < S && e0 + s < N ? order_key(ch[s]) : 0u;
  float sum = 0.f, my_w = 0.f;
  int my_id = 0;
  for (int r = 0; r < a.top_k; ++r) {
    unsigned bk = 0u;  // this lane's best expert left: the lowest slot of the largest key
    int bs = 0;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
      if (key[s] > bk) {
        bk = key[s];
        bs = s;
      }
    const unsigned best = __reduce_max_sync(kFull, bk);
    const int owner = __ffs(__ballot_sync(kFull, bk == best)) - 1;  // the lowest lane: its experts are the lower ones
    float mine = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {  // no dynamic register indexing
      mine = s == bs ? sc[s] : mine;
      if (lane == owner && s == bs) key[s] = 0u;  // taken
    }
    const float w = __shfl_sync(kFull, mine, owner);
    const int slot = __shfl_sync(kFull, bs, owner);
    sum += w;  // in pick order, every lane the same
    if (lane == r) {
      my_w = w;
      my_id = owner * S + slot;
    }
  }
  if (lane < a.top_k) {
    float w = my_w;
    if (a.flags & kRenorm) w = w / (sum + 1e-20f);
    if (a.scaling != 1.0f) w = w * a.scaling;
    const size_t at = static_cast<size_t>(m) * a.top_k + lane;
    a.ids[at] = my_id;
    a.weights[at] = w;
  }
}

// The ticket: atom.inc wraps to 0 at `bound`, so the last of bound + 1 CTAs leaves the word zero. acq_rel at gpu
// scope: it releases what this CTA stored before its barrier and, for the last CTA, acquires what every other stored.
__device__ __forceinline__ unsigned take_ticket(unsigned* counter, unsigned bound) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(bound) : "memory");
  return old;
}

// After this CTA stored its logits: thread 0 takes a ticket; the CTA that draws the last (of `ctas`) selects for every
// token, one warp per token, every warp of the block. Every thread of the CTA calls it.
template <int MAX_N>
__device__ __forceinline__ void select_when_last(const Args& a, unsigned ctas) {
  static_assert(MAX_N % kWarp == 0 && MAX_N / kWarp <= 32, "MAX_N: a multiple of 32, at most 1024");
  constexpr int SLOTS = MAX_N / kWarp;
  __shared__ int last;
  __syncthreads();  // every logit this CTA stored happens before thread 0's release
  if (threadIdx.x == 0) last = take_ticket(a.counter, ctas - 1u) == ctas - 1u;
  __syncthreads();  // and thread 0's acquire before any read below
  if (!last) return;
  const Layout l = layout<SLOTS>(a.N, a.n_group);
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  for (int m = static_cast<int>(threadIdx.x) / kWarp; m < a.M; m += warps) select_token<SLOTS>(a, m, l.S, l.lpg);
}

// The Blackwell-class body: the skinny-GEMM family's tensor-core GEMM (hwprofile/gemv.cuh) into the
// logits, then the selection by the last CTA. L: the SM's limits (hwprofile/skinny_entry.cuh).
template <class L, int MT, int WARPS, int NT, int KSPLIT, int U, int MAX_N>
__device__ __forceinline__ void skinny_gate(const Args& a, float* logits, const __nv_bfloat16* x, const void* w, int K) {
  check_entry_limits<L, WARPS, KSPLIT>();
  static_assert((WARPS * NT * 128 + NT * 128) * 4 + 4 <= L::kMaxStaticShared, "static shared memory of the reduction and the ticket");
  skinny_gemm<false, float, MT, WARPS, NT, KSPLIT, U, kNoScale>(logits, x, w, nullptr, a.M, a.N, K);
  if (KSPLIT > 1 && cluster_rank() != 0) return;  // rank 0 of each cluster stored its block of logits
  select_when_last<MAX_N>(a, gridDim.x);
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
