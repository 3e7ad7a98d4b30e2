// hwprofile shared device code: the FP8 (W8A16) skinny GEMM, out[M,N] = x[M,K] . (w[N,K] e4m3 * scale)^T, M <= 16.
//
// Device functions only (entry points: hwprofile-sm90's kernels/sm90_fp8.cu, and the family's <P>_skinny_mma of
// hwprofile/skinny_entry.cuh with FP8 = true). The layout is hwprofile/gemv.cuh's skinny_gemm (read its comment):
// the M tokens are the rows of mma.sync m16n8k16 (bf16 in, fp32 accumulate), 8 weight rows its columns, so each
// e4m3 weight is read from HBM once for all M tokens and the FLOPs ride on the tensor cores. Lane (g, t) loads
// 16 bytes (16 values) of weight row n0 + 8j + g at chunk offset 16t: 4 lanes read 64 contiguous bytes of a row,
// and the same 16 k of x rows g and g + 8 (two 16-byte vectors each) are its A fragments.
//
// What differs from skinny_gemm's bf16 path, and why:
//  * the dequantisation. At M <= 16 the tensor cores make the multiply-adds nearly free, which leaves the
//    e4m3 -> bf16 conversion as the per-weight cost. The hardware cvt (e4m3x2 -> f16x2, then f16 -> f32 ->
//    bf16x2: 4 instructions per 2 values, half of them on the conversion pipe, which issues at a quarter of the
//    integer pipe's rate on sm_90) would bound the kernel below the HBM rate. e4m3x4_to_bf16x2x2 instead
//    rebuilds the bits on the integer pipe and rescales by 2^120 in bf16 on the FMA pipe: exact for every
//    finite e4m3 value (subnormals and signed zeros included). NaN is the one value the bit trick does not keep;
//    e4m3_nan_bits flags it per weight row, and the row's results become NaN, as the dequantised product's are.
//  * the scale is applied once to the fp32 sum (per tensor: scale[0]; per row: scale[n]), then rounded to the
//    output type once: the contract of ops.fp8_gemv (hwprofile.ops._fallbacks.fp8_dequant_mm computes the same).
#pragma once
#include <hwprofile/gemv.cuh>

namespace hwp {

// Four e4m3 values (one 32-bit word, byte i = element i) -> two bf16x2 (elements 0,1 in lo, 2,3 in hi), exactly.
// A byte s.eeee.mmm is placed as the bf16 s.0000eeee.mmm0000 (byte permute, shift, mask, merge), which reads
// 2^(eeee-127) * 1.mmm (an e4m3 subnormal, eeee = 0, reads 2^-126 * 0.mmm), then multiplied by 2^120 (127 - 7)
// in bf16: exact, as every e4m3 value is a bf16 value and bf16 arithmetic does not flush subnormal inputs.
// An e4m3 NaN (s.1111.111) comes out as +-480 (past the largest finite e4m3, 448): see e4m3_nan_bits.
__device__ __forceinline__ void e4m3x4_to_bf16x2x2(unsigned w, unsigned& lo, unsigned& hi) {
  const __nv_bfloat162 bias = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
  const unsigned p0 = __byte_perm(w, 0u, 0x1404), p1 = __byte_perm(w, 0u, 0x3424);  // bytes 0,1 / 2,3 -> bits 8..15 / 24..31
  const unsigned q0 = ((p0 >> 4) & 0x07f007f0u) | (p0 & 0x80008000u);
  const unsigned q1 = ((p1 >> 4) & 0x07f007f0u) | (p1 & 0x80008000u);
  const __nv_bfloat162 b0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&q0), bias);
  const __nv_bfloat162 b1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&q1), bias);
  lo = *reinterpret_cast<const unsigned*>(&b0);
  hi = *reinterpret_cast<const unsigned*>(&b1);
}

// Bit 7 of byte i is set when byte i of w is an e4m3 NaN (low 7 bits all ones: adding one carries into bit 7; no
// byte carries into the next). OR the results over a row: (bits & 0x80808080) != 0 <=> the row holds a NaN.
__device__ __forceinline__ unsigned e4m3_nan_bits(unsigned w) { return (w & 0x7f7f7f7fu) + 0x01010101u; }

template <typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>
__device__ __forceinline__ void skinny_fp8(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                           const unsigned char* __restrict__ w, const float* __restrict__ scale,
                                           int M, int N, int K) {
  static_assert(MT == 1 || MT == 2, "M tile: 8 or 16 tokens");
  static_assert(KSPLIT == 1 || KSPLIT == 2 || KSPLIT == 4 || KSPLIT == 8, "portable cluster sizes");
  static_assert(SCALE == kTensorScale || SCALE == kRowScale, "an FP8 weight has a scale, per tensor or per row");
  constexpr int CK = 64;           // k per chunk: 4 lanes x 16 e4m3
  constexpr int TILE = NT * 128;   // accumulator floats per warp (NT tiles x 32 lanes x 4)
  __shared__ float red[WARPS * TILE];
  __shared__ float part[KSPLIT > 1 ? TILE : 1];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * (8 * NT);
  const int kc = (K + CK - 1) / CK;
  const int split = KSPLIT > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int units = KSPLIT * WARPS;
  const int per = (kc + units - 1) / units;
  const int c0 = min(kc, (split * WARPS + warp) * per), c1 = min(kc, c0 + per);

  const unsigned char* wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) wrow[j] = w + static_cast<size_t>(min(n0 + 8 * j + g, N - 1)) * K;
  const bool has0 = g < M, has1 = MT == 2 && g + 8 < M;
  const __nv_bfloat16* x0 = x + static_cast<size_t>(min(g, M - 1)) * K;
  const __nv_bfloat16* x1 = x + static_cast<size_t>(min(g + 8, M - 1)) * K;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  float acc[NT][4];
  unsigned nanbits[NT];  // e4m3_nan_bits of this lane's share of weight row n0 + 8j + g
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    nanbits[j] = 0u;
  }

  for (int c = c0; c < c1; c += U) {
    uint4 wv[U][NT], xa[U][2], xb[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every weight load of the batch first, from clamped addresses, masked after
      const int k = (c + u) * CK + t * 16;
      const bool ok = c + u < c1 && k < K;
      const int kk = ok ? k : 0;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 v = load_stream(wrow[j] + kk);
        wv[u][j] = ok ? v : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {  // then x (L1/L2: reused by every block of the same K range)
      const int k = (c + u) * CK + t * 16;
      const bool ok = c + u < c1 && k < K;
      const int kk = ok ? k : 0;
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const uint4 a = load_reused(x0 + kk + 8 * v);
        xa[u][v] = ok && has0 ? a : zero;
        if constexpr (MT == 2) {
          const uint4 b = load_reused(x1 + kk + 8 * v);
          xb[u][v] = ok && has1 ? b : zero;
        } else {
          xb[u][v] = zero;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned xs0[8] = {xa[u][0].x, xa[u][0].y, xa[u][0].z, xa[u][0].w, xa[u][1].x, xa[u][1].y, xa[u][1].z, xa[u][1].w};
      const unsigned xs1[8] = {xb[u][0].x, xb[u][0].y, xb[u][0].z, xb[u][0].w, xb[u][1].x, xb[u][1].y, xb[u][1].z, xb[u][1].w};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const unsigned ws[4] = {wv[u][j].x, wv[u][j].y, wv[u][j].z, wv[u][j].w};
        nanbits[j] |= e4m3_nan_bits(ws[0]) | e4m3_nan_bits(ws[1]) | e4m3_nan_bits(ws[2]) | e4m3_nan_bits(ws[3]);
#pragma unroll
        for (int s = 0; s < 4; ++s) {  // word s: k 4s .. 4s+3 of the lane's 16 (b0: 4s, 4s+1; b1: 4s+2, 4s+3), x alike
          unsigned b0, b1;
          e4m3x4_to_bf16x2x2(ws[s], b0, b1);
          mma_bf16(acc[j], xs0[2 * s], xs1[2 * s], xs0[2 * s + 1], xs1[2 * s + 1], b0, b1);
        }
      }
    }
  }

  // A NaN weight makes its row's result NaN for every token: this lane's flag is for weight row 8j + g, its
  // accumulators hold rows 8j + 2t (q = 0, 2) and 8j + 2t + 1 (q = 1, 3).
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    unsigned f = nanbits[j] & 0x80808080u;
    f |= __shfl_xor_sync(0xffffffffu, f, 1);
    f |= __shfl_xor_sync(0xffffffffu, f, 2);  // the 4 lanes of group g share row g's flag
    const unsigned f0 = __shfl_sync(0xffffffffu, f, 8 * t), f1 = __shfl_sync(0xffffffffu, f, 8 * t + 4);
    if (f0) acc[j][0] = acc[j][2] = __int_as_float(0x7fffffff);
    if (f1) acc[j][1] = acc[j][3] = __int_as_float(0x7fffffff);
  }

  // Sum the warps' tiles (fixed order), then the cluster's blocks (fixed order), then scale and store.
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) red[warp * TILE + (j * 32 + lane) * 4 + q] = acc[j][q];
  __syncthreads();

  auto coords = [&](int i, int& m, int& n) {  // accumulator index -> (token, weight row)
    const int q = i & 3, l = (i >> 2) & 31, j = i >> 7;
    m = (l >> 2) + (q >= 2 ? 8 : 0);
    n = n0 + 8 * j + 2 * (l & 3) + (q & 1);
  };
  auto finish = [&](int m, int n, float s) {
    s *= SCALE == kTensorScale ? scale[0] : scale[n];
    out[static_cast<size_t>(m) * N + n] = to_out<TOut>(s);
  };

  for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
    int m, n;
    coords(i, m, n);
    if (m >= M || n >= N) continue;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) s += red[q * TILE + i];
    if constexpr (KSPLIT == 1) finish(m, n, s);
    else part[i] = s;
  }
  if constexpr (KSPLIT > 1) {
    cluster_sync();  // every rank's block partial is visible
    if (split == 0) {
      for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
        int m, n;
        coords(i, m, n);
        if (m >= M || n >= N) continue;
        float s = part[i];
#pragma unroll
        for (int r = 1; r < KSPLIT; ++r) s += load_remote_f32(&part[i], r);
        finish(m, n, s);
      }
    }
    cluster_sync();  // keep every rank's shared memory alive until rank 0 has read it
  }
}

}  // namespace hwp
