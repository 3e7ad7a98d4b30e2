// hwprofile-sm90: the DeepSeek-V3 / Kimi-K2 expert selection of ops.moe_gate, built by NVRTC.
//
// The gate step is two launches on one stream: the router GEMM (hwp90_router of sm90_gemv.cu,
// fp32 logits [M, N], launched with programmatic dependent launch, which asks for its dependents
// early) and this kernel, also launched with PDL: its blocks start while the GEMM finishes and
// wait (griddepcontrol.wait) before reading the logits. The selection replaces a chain of about
// fifteen torch kernels (sigmoid, add, view/topk/sum, sort, scatter, masked_fill, sort, gather,
// sum, div, mul) by one.
//
// One warp per token (grid M, block 32): N <= 512 experts, expert e held by lane e % 32 at slot
// e / 32 (conflict-free shared-memory reads). The rules are those of hwprofile.ops._fallbacks.grouped_topk:
//   score = sigmoid(logit); choice = score + bias;
//   n_group > 1: a group's score is the sum of its two largest choice values; the topk_group best
//     groups stay (ties: the lower group), the experts of the others are -inf;
//   the top_k largest choice values are picked in descending order (ties: the lower expert);
//   weight = the unbiased score of a picked expert, / (sum + 1e-20) if renormalize, * scaling.
// Generic CUDA (no architecture-specific instruction but griddepcontrol, sm_90 and later), so the
// same source compiles for sm_90a, sm_100a and sm_120a.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "moe_gate.cu needs sm_90 or later (griddepcontrol)"
#endif

namespace hwpgate {

constexpr int kWarp = 32;
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }  // NVRTC has no <cmath> INFINITY

// (value, index) order of a stable descending sort: a larger value first, equal values by the lower index
__device__ __forceinline__ bool before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// the warp's best (value, index) pair; every lane gets it
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

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }  // torch's fp32 sigmoid, not __expf

template <int MAX_N>
__device__ __forceinline__ void gate(long long* __restrict__ ids, float* __restrict__ weights, const float* __restrict__ logits,
                                     const float* __restrict__ bias, int N, int n_group, int topk_group, int top_k, int renorm,
                                     float scaling) {
  static_assert(MAX_N % kWarp == 0 && MAX_N / kWarp <= 32, "a lane's taken-mask is one 32-bit word");
  constexpr int SLOTS = MAX_N / kWarp;
  __shared__ float score[MAX_N];
  __shared__ float choice[MAX_N];
  __shared__ float gscore[kWarp];
  const int lane = threadIdx.x, m = blockIdx.x;

  asm volatile("griddepcontrol.wait;" ::: "memory");  // the logits belong to the predecessor grid (the router GEMM)
  const float* row = logits + static_cast<size_t>(m) * N;
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int e = lane + kWarp * s;
    if (e < N) {
      const float sc = sigmoid(row[e]);
      score[e] = sc;
      choice[e] = bias != nullptr ? sc + bias[e] : sc;
    }
  }
  __syncwarp();

  if (n_group > 1) {  // n_group <= 32 (the planner's bound): lane g scores group g
    const int per = N / n_group;
    if (lane < n_group) {
      float a = neg_inf(), b = neg_inf();  // the two largest of the group (values only: their order cannot change the sum)
      for (int j = 0; j < per; ++j) {
        const float v = choice[lane * per + j];
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      gscore[lane] = a + b;
    }
    __syncwarp();
    float gv = lane < n_group ? gscore[lane] : neg_inf();
    bool kept = false;
    for (int r = 0; r < topk_group; ++r) {
      float v = lane < n_group && !kept ? gv : neg_inf();
      int i = lane < n_group && !kept ? lane : 0x7fffffff;
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
  for (int r = 0; r < top_k; ++r) {
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
    if ((i & (kWarp - 1)) == lane) taken |= 1u << (i / kWarp);
    const float w = score[i];
    sum += w;  // in pick order, every lane the same
    if (lane == r) picked = w;
    if (lane == r) ids[static_cast<size_t>(m) * top_k + r] = i;
  }
  if (lane < top_k) {
    float w = picked;
    if (renorm) w = w / (sum + 1e-20f);
    if (scaling != 1.0f) w = w * scaling;
    weights[static_cast<size_t>(m) * top_k + lane] = w;
  }
}

}  // namespace hwpgate

// Entry point: hwp90_moe_gate<MAX_N>, grid (M), block 32, launched with PDL. ids [M, top_k] int64,
// weights [M, top_k] fp32, logits [M, N] fp32, bias [N] fp32 or null. N <= MAX_N, top_k <= 32,
// n_group <= 32 dividing N (hwprofile_sm90.moe_gate checks every bound before launching).
template <int MAX_N>
__global__ void __launch_bounds__(32) hwp90_moe_gate(long long* __restrict__ ids, float* __restrict__ weights,
                                                   const float* __restrict__ logits, const float* __restrict__ bias, int /*M*/, int N,
                                                   int n_group, int topk_group, int top_k, int renorm, float scaling) {
  hwpgate::gate<MAX_N>(ids, weights, logits, bias, N, n_group, topk_group, top_k, renorm, scaling);
}
