// hwprofile shared kernel building block: skinny GEMM / GEMV, out[M,N] = x[M,K] . w[N,K]^T.
//
// One template serves the router GEMM (M = 1..16, fp32 out), the small-M fp32-output linear,
// the bf16 GEMV (M = 1, bf16 out) and the FP8 e4m3 GEMV (per-tensor or per-row scale).
// Architecture plugins instantiate it with their own tile constants and check them against their
// SM's limits (see each plugin's kernels/*.cu); the structure is the one tested on the H200.
//
// Structure:
//  * a block owns WARPS*ROWS consecutive output rows n; each warp owns ROWS of them;
//  * the K range is split over KSPLIT blocks of one thread-block cluster (grid.y == KSPLIT);
//  * the block stages its slice of x (M rows, bf16) in shared memory once, then every lane streams
//    16-byte weight vectors with evict-first loads (weights are read once), UNROLL vectors deep,
//    accumulating ROWS x M dot products in fp32 registers;
//  * a warp butterfly reduces the lanes; with KSPLIT > 1 the cluster's partials are summed by
//    block rank 0 through distributed shared memory in fixed rank order (deterministic);
//  * rows past N clamp their loads to row N-1 and never store, so any N works; K must be a
//    multiple of the 16-byte vector (8 bf16 or 16 fp8 values).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>

namespace hwp {

enum Scale { kNoScale = 0, kTensorScale = 1, kRowScale = 2 };

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  // Weights are read exactly once: cache-streaming (evict-first) so they do not evict x.
  return __ldcs(p);
}

__device__ __forceinline__ float2 bf2_to_f2(unsigned v) {
  // bf16 -> fp32 is a 16-bit shift; no conversion instruction needed.
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

template <int M, int ROWS>
__device__ __forceinline__ void fma_bf16(float (&acc)[ROWS][M], const uint4 (&w)[ROWS], const uint4* xs, int xstride) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint4 xv = xs[m * xstride];
    const float2 x0 = bf2_to_f2(xv.x), x1 = bf2_to_f2(xv.y), x2 = bf2_to_f2(xv.z), x3 = bf2_to_f2(xv.w);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float2 w0 = bf2_to_f2(w[r].x), w1 = bf2_to_f2(w[r].y), w2 = bf2_to_f2(w[r].z), w3 = bf2_to_f2(w[r].w);
      float a = acc[r][m];
      a = fmaf(w0.x, x0.x, a); a = fmaf(w0.y, x0.y, a);
      a = fmaf(w1.x, x1.x, a); a = fmaf(w1.y, x1.y, a);
      a = fmaf(w2.x, x2.x, a); a = fmaf(w2.y, x2.y, a);
      a = fmaf(w3.x, x3.x, a); a = fmaf(w3.y, x3.y, a);
      acc[r][m] = a;
    }
  }
}

__device__ __forceinline__ float2 e4m3x2_to_f2(unsigned short v) {
  // Hardware cvt (sm_89+) from two e4m3 values to half2, then to float2.
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

__device__ __forceinline__ float dot8_fp8(unsigned wlo, unsigned whi, const uint4& xv, float a) {
  const float2 w0 = e4m3x2_to_f2(wlo & 0xffffu), w1 = e4m3x2_to_f2(wlo >> 16);
  const float2 w2 = e4m3x2_to_f2(whi & 0xffffu), w3 = e4m3x2_to_f2(whi >> 16);
  const float2 x0 = bf2_to_f2(xv.x), x1 = bf2_to_f2(xv.y), x2 = bf2_to_f2(xv.z), x3 = bf2_to_f2(xv.w);
  a = fmaf(w0.x, x0.x, a); a = fmaf(w0.y, x0.y, a);
  a = fmaf(w1.x, x1.x, a); a = fmaf(w1.y, x1.y, a);
  a = fmaf(w2.x, x2.x, a); a = fmaf(w2.y, x2.y, a);
  a = fmaf(w3.x, x3.x, a); a = fmaf(w3.y, x3.y, a);
  return a;
}

template <int M, int ROWS>
__device__ __forceinline__ void fma_fp8(float (&acc)[ROWS][M], const uint4 (&w)[ROWS], const uint4* xs, int xstride) {
  // One 16-byte weight vector holds 16 e4m3 values; x for them is two 16-byte bf16 vectors.
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint4 xa = xs[m * xstride * 2], xb = xs[m * xstride * 2 + 1];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float a = acc[r][m];
      a = dot8_fp8(w[r].x, w[r].y, xa, a);
      a = dot8_fp8(w[r].z, w[r].w, xb, a);
      acc[r][m] = a;
    }
  }
}

template <typename TOut> __device__ __forceinline__ TOut to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 to_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float load_remote_f32(const float* local, unsigned rank) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local)), remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// FP8: true when weights are e4m3 bytes (16 per vector), false for bf16 (8 per vector).
template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int UNROLL, int SCALE>
__device__ __forceinline__ void skinny_gemm(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                            const void* __restrict__ w, const float* __restrict__ scale, int N, int K,
                                            uint4* xs_smem) {
  constexpr int VEC = FP8 ? 16 : 8;            // weight elements per 16-byte vector
  constexpr int XV = FP8 ? 2 : 1;              // 16-byte x vectors per weight vector
  __shared__ float red[KSPLIT > 1 ? WARPS * ROWS * M : 1];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvec = K / VEC;                                   // weight vectors per row
  const int per = (kvec + KSPLIT - 1) / KSPLIT;
  const int split = KSPLIT > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int v0 = min(kvec, split * per), v1 = min(kvec, v0 + per);
  const int nv = v1 - v0;                                     // vectors in this block's K slice

  // Stage x[:, slice] (bf16) in shared memory: M rows of nv*XV 16-byte vectors.
  const int xstride = nv;                                     // in weight-vector units
  for (int i = threadIdx.x; i < M * nv * XV; i += WARPS * 32) {
    const int m = i / (nv * XV), j = i - m * (nv * XV);
    xs_smem[i] = __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * K) + v0 * XV + j);
  }
  __syncthreads();

  const int row0 = blockIdx.x * (WARPS * ROWS) + warp * ROWS;
  const uint4* wrow[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int n = min(row0 + r, N - 1);                       // clamp: rows past N load, never store
    wrow[r] = reinterpret_cast<const uint4*>(static_cast<const char*>(w) + static_cast<size_t>(n) * K * (FP8 ? 1 : 2)) + v0;
  }

  float acc[ROWS][M];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  int v = lane;
  for (; v + 32 * (UNROLL - 1) < nv; v += 32 * UNROLL) {
    uint4 wv[UNROLL][ROWS];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) wv[u][r] = load_stream(wrow[r] + v + 32 * u);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if constexpr (FP8) fma_fp8<M, ROWS>(acc, wv[u], xs_smem + (v + 32 * u) * XV, xstride);
      else fma_bf16<M, ROWS>(acc, wv[u], xs_smem + (v + 32 * u) * XV, xstride);
    }
  }
  for (; v < nv; v += 32) {
    uint4 wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wv[r] = load_stream(wrow[r] + v);
    if constexpr (FP8) fma_fp8<M, ROWS>(acc, wv, xs_smem + v * XV, xstride);
    else fma_bf16<M, ROWS>(acc, wv, xs_smem + v * XV, xstride);
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);

  auto finish = [&](int n, int m, float s) {
    if (n < N) {
      if (SCALE == kTensorScale) s *= scale[0];
      if (SCALE == kRowScale) s *= scale[n];
      out[static_cast<size_t>(m) * N + n] = to_out<TOut>(s);
    }
  };

  if constexpr (KSPLIT == 1) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == ((r * M + m) & 31)) finish(row0 + r, m, acc[r][m]);
  } else {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == ((r * M + m) & 31)) red[(warp * ROWS + r) * M + m] = acc[r][m];
    cluster_sync();                                           // partials of every rank are visible
    if (split == 0) {
      for (int i = threadIdx.x; i < WARPS * ROWS * M; i += WARPS * 32) {
        float s = red[i];
#pragma unroll
        for (int q = 1; q < KSPLIT; ++q) s += load_remote_f32(&red[i], q);   // fixed order: deterministic
        finish(blockIdx.x * (WARPS * ROWS) + i / M, i % M, s);
      }
    }
    cluster_sync();                                           // keep every rank's smem alive until read
  }
}

}  // namespace hwp

// Entry points. Name expressions: hwp_skinny_gemm<FP8, TOut, M, WARPS, ROWS, KSPLIT, UNROLL, SCALE>.
template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int UNROLL, int SCALE>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp_skinny_gemm(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
                const float* __restrict__ scale, int N, int K) {
  extern __shared__ uint4 hwp_xs[];
  hwp::skinny_gemm<FP8, TOut, M, WARPS, ROWS, KSPLIT, UNROLL, SCALE>(out, x, w, scale, N, K, hwp_xs);
}
