// hwprofile shared device code: skinny GEMM / GEMV, out[M,N] = x[M,K] . w[N,K]^T, M <= 16.
//
// Device functions only: every architecture plugin declares its own __global__ entry points in its
// kernels/*.cu, with static_asserts for the limits of its SM (cluster size, static shared memory),
// and plans the dynamic shared memory in Python against the same limit. What is here is what more
// than one plugin uses: the 16-byte load helpers, mma.sync m16n8k16 (bf16 in, fp32 accumulate; on
// sm_90, sm_100 and sm_120 alike), e4m3 conversion, cluster/DSMEM helpers, and two kernel bodies:
// skinny_gemm (tensor cores, M <= 16) and simt_gemv (SIMT FMAs, small fixed M). Both were first
// measured on the H200; hwprofile-sm100 and -sm120 instantiate them unmeasured on their SMs.
//
// Why this shape: at M <= 16 the work is a stream of weights, and what costs time is latency, not
// arithmetic. So every lane issues all of its 16-byte weight loads of a batch before using any,
// and the few FLOPs go to the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), which
// also removes the per-lane dot-product reduction: the M tokens are the MMA's 16 rows, the weight
// rows are its 8 columns.
//
//  * a block owns 8*NT consecutive weight rows n; its WARPS warps and the KSPLIT blocks of one
//    thread-block cluster (grid.y == KSPLIT) split the K range between them;
//  * lane (g = lane/4, t = lane%4) loads 16 bytes of weight row n0+8j+g at chunk offset 16*t:
//    4 lanes read 64 contiguous bytes of a row; the same k offsets of x rows g and g+8 are its A
//    fragment (the dot product does not care how k is permuted, as long as A and B agree);
//  * weights are read with evict-first (streaming) loads, x through L1/L2 (it is reused);
//  * partial tiles are summed over the warps in shared memory and over the cluster's blocks by
//    rank 0 through distributed shared memory, in fixed order: deterministic;
//  * rows past N clamp their loads to row N-1 and never store; K only needs to be a multiple of
//    the 16-byte vector (8 bf16 or 16 fp8 values); M is a runtime argument (MT = 1: M <= 8,
//    MT = 2: M <= 16).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>

namespace hwp {

enum Scale { kNoScale = 0, kTensorScale = 1, kRowScale = 2 };

__device__ __forceinline__ uint4 load_stream(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict-first
}

__device__ __forceinline__ uint4 load_reused(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// D += A(16x16, row) . B(16x8, col); bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm(  // not volatile: a pure function of its operands, so loads may be hoisted above it
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two e4m3 values -> bf16x2, exactly (e4m3 is a subset of bf16): hardware cvt to f16x2 first.
__device__ __forceinline__ unsigned e4m3x2_to_bf16x2(unsigned short v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<unsigned*>(&b);
}

template <typename TOut> __device__ __forceinline__ TOut to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 to_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Full cluster barrier: every thread of every block of the cluster, release/acquire ordered.
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

template <bool FP8, typename TOut, int MT, int WARPS, int NT, int KSPLIT, int U, int SCALE>
__device__ __forceinline__ void skinny_gemm(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                            const void* __restrict__ w, const float* __restrict__ scale,
                                            int M, int N, int K) {
  static_assert(MT == 1 || MT == 2, "M tile: 8 or 16 tokens");
  static_assert(KSPLIT == 1 || KSPLIT == 2 || KSPLIT == 4 || KSPLIT == 8, "portable cluster sizes");
  constexpr int ESZ = FP8 ? 1 : 2;     // weight bytes per element
  constexpr int VEC = 16 / ESZ;        // weight elements per 16-byte vector (per lane per chunk)
  constexpr int CK = 4 * VEC;          // k per chunk: 4 lanes x 16 bytes
  constexpr int XV = FP8 ? 2 : 1;      // 16-byte x vectors per lane per chunk per token row
  constexpr int ROWS = 8 * NT;
  constexpr int TILE = NT * 128;       // accumulator floats per warp (NT tiles x 32 lanes x 4)
  __shared__ float red[WARPS * TILE];
  __shared__ float part[KSPLIT > 1 ? TILE : 1];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * ROWS;
  const int kc = (K + CK - 1) / CK;
  const int split = KSPLIT > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int units = KSPLIT * WARPS;
  const int per = (kc + units - 1) / units;
  const int c0 = min(kc, (split * WARPS + warp) * per), c1 = min(kc, c0 + per);

  const char* wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)
    wrow[j] = static_cast<const char*>(w) + static_cast<size_t>(min(n0 + 8 * j + g, N - 1)) * K * ESZ;
  const bool has0 = g < M, has1 = MT == 2 && g + 8 < M;
  const __nv_bfloat16* x0 = x + static_cast<size_t>(min(g, M - 1)) * K;
  const __nv_bfloat16* x1 = x + static_cast<size_t>(min(g + 8, M - 1)) * K;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int c = c0; c < c1; c += U) {
    uint4 wv[U][NT], xa[U][XV], xb[U][XV];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // issue every load of the batch before any use
      // Straight-line loads from clamped (always valid) addresses, masked afterwards: no branch
      // splits the batch, so the compiler keeps every load of it in flight at once.
      const int k = (c + u) * CK + t * VEC;
      const bool ok = c + u < c1 && k < K;
      const int kk = ok ? k : 0;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 v = load_stream(wrow[j] + static_cast<size_t>(kk) * ESZ);
        wv[u][j] = ok ? v : zero;
      }
#pragma unroll
      for (int v = 0; v < XV; ++v) {
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
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if constexpr (!FP8) {
          mma_bf16(acc[j], xa[u][0].x, xb[u][0].x, xa[u][0].y, xb[u][0].y, wv[u][j].x, wv[u][j].y);
          mma_bf16(acc[j], xa[u][0].z, xb[u][0].z, xa[u][0].w, xb[u][0].w, wv[u][j].z, wv[u][j].w);
        } else {
          const unsigned ws[4] = {wv[u][j].x, wv[u][j].y, wv[u][j].z, wv[u][j].w};
          const unsigned xs0[8] = {xa[u][0].x, xa[u][0].y, xa[u][0].z, xa[u][0].w, xa[u][1].x, xa[u][1].y, xa[u][1].z, xa[u][1].w};
          const unsigned xs1[8] = {xb[u][0].x, xb[u][0].y, xb[u][0].z, xb[u][0].w, xb[u][1].x, xb[u][1].y, xb[u][1].z, xb[u][1].w};
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const unsigned b0 = e4m3x2_to_bf16x2(static_cast<unsigned short>(ws[s] & 0xffffu));
            const unsigned b1 = e4m3x2_to_bf16x2(static_cast<unsigned short>(ws[s] >> 16));
            mma_bf16(acc[j], xs0[2 * s], xs1[2 * s], xs0[2 * s + 1], xs1[2 * s + 1], b0, b1);
          }
        }
      }
    }
  }

  // Sum the warps' tiles (fixed order), then the cluster's blocks (fixed order), then store.
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
    if (SCALE == kTensorScale) s *= scale[0];
    if (SCALE == kRowScale) s *= scale[n];
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


// ---------------------------------------------------------------------------------------------
// SIMT GEMV for M = 1 (and small M): one warp owns ROWS rows; lanes stride the block's K slice
// with 16-byte loads, so each warp load instruction reads 512 contiguous bytes of one row (the
// pattern HBM streams best). x's K slice is staged in shared memory once per block; the first
// batch of weight loads is issued before that staging, and each later batch is issued before the
// previous one is consumed (register double buffer), so the weight stream never waits on x.
// XCHUNK = 0 stages the whole slice (M * slice * 2 bytes). XCHUNK > 0 (weight vectors, a multiple
// of the batch 32 * U) streams x through two buffers of that many vectors per token: a long K (a
// 32768-wide down projection is 64 KB of x) would otherwise take so much shared memory per block
// that few blocks fit on an SM and too few weight loads are in flight. The buffers are filled by
// cp.async (global -> shared without registers, so the double-buffered weights keep theirs) one
// chunk ahead: entering chunk c, the block waits for its copy (issued when chunk c-1 began) and
// one __syncthreads, then starts copying chunk c+1 into the buffer chunk c-1 has left. A batch
// never straddles two chunks, and the next batch's weight loads are in flight across the wait.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float2 bf2_to_f2(unsigned v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));  // bf16 -> fp32 is a shift
}

__device__ __forceinline__ float2 e4m3x2_to_f2(unsigned short v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

// 16 bytes global -> shared, asynchronously (sm_80+: every target here), cached in L2 only; completion
// is per thread, by commit group.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(smem))), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory"); }

template <bool FP8>
__device__ __forceinline__ float dot_vec(const uint4& wv, const uint4* xs, float a) {
  if constexpr (!FP8) {
    const uint4 xv = xs[0];
    const unsigned wr[4] = {wv.x, wv.y, wv.z, wv.w}, xr[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 w2 = bf2_to_f2(wr[i]), x2 = bf2_to_f2(xr[i]);
      a = fmaf(w2.x, x2.x, a);
      a = fmaf(w2.y, x2.y, a);
    }
  } else {
    const uint4 xa = xs[0], xb = xs[1];
    const unsigned wr[4] = {wv.x, wv.y, wv.z, wv.w}, xr[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 w0 = e4m3x2_to_f2(static_cast<unsigned short>(wr[i] & 0xffffu)), w1 = e4m3x2_to_f2(static_cast<unsigned short>(wr[i] >> 16));
      const float2 x0 = bf2_to_f2(xr[2 * i]), x1 = bf2_to_f2(xr[2 * i + 1]);
      a = fmaf(w0.x, x0.x, a);
      a = fmaf(w0.y, x0.y, a);
      a = fmaf(w1.x, x1.x, a);
      a = fmaf(w1.y, x1.y, a);
    }
  }
  return a;
}

template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE, int XCHUNK = 0>
__device__ __forceinline__ void simt_gemv(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                          const void* __restrict__ w, const float* __restrict__ scale,
                                          int N, int K, uint4* xs) {
  constexpr int VEC = FP8 ? 16 : 8;   // weight elements per 16-byte vector
  constexpr int XV = FP8 ? 2 : 1;     // 16-byte x vectors per weight vector
  static_assert(XCHUNK >= 0 && XCHUNK % (32 * U) == 0, "an x chunk holds whole batches of 32 * U weight vectors");
  __shared__ float red[KSPLIT > 1 ? WARPS * ROWS * M : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvec = K / VEC;
  const int per = (kvec + KSPLIT - 1) / KSPLIT;
  const int split = KSPLIT > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int v0 = min(kvec, split * per), nv = min(kvec, v0 + per) - v0;
  const int row0 = blockIdx.x * (WARPS * ROWS) + warp * ROWS;
  const uint4* wrow[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
    wrow[r] = reinterpret_cast<const uint4*>(static_cast<const char*>(w) + static_cast<size_t>(min(row0 + r, N - 1)) * K * (FP8 ? 1 : 2)) + v0;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  uint4 cur[U][ROWS], nxt[U][ROWS];
  int v = lane;
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {  // clamped address, masked value: straight-line, all in flight
      const bool ok = v + 32 * u < nv;
      const uint4 t = load_stream(wrow[r] + (ok ? v + 32 * u : 0));
      cur[u][r] = ok ? t : zero;
    }

  // Chunked: chunk c (weight vectors [c * XCHUNK, (c + 1) * XCHUNK) of the slice) lives in buffer
  // c & 1; `cb` is the first vector of the chunk being consumed (block-uniform: every warp walks the
  // same v), `ch` its number.
  constexpr bool CHUNKED = XCHUNK > 0;
  constexpr int XBUF = CHUNKED ? M * XCHUNK * XV : 1;  // uint4 per buffer
  int cb = 0, ch = 0;
  auto stage = [&](int c) {  // chunk c -> buffer c & 1 by cp.async, one commit group (empty past the slice)
    const int base = c * XCHUNK, len = max(0, min(XCHUNK, nv - base)) * XV;
    uint4* buf = xs + (c & 1) * XBUF;
    for (int i = threadIdx.x; i < M * len; i += WARPS * 32) {
      const int m = M == 1 ? 0 : i / len, j = i - m * len;
      cp_async16(buf + m * XCHUNK * XV + j, reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * K) + (v0 + base) * XV + j);
    }
    cp_async_commit();
  };
  if constexpr (CHUNKED) {
    stage(0);  // while the first weights fly
    stage(1);
    cp_async_wait<1>();  // chunk 0 is in (chunk 1 may still be in flight)
  } else {
    for (int i = threadIdx.x; i < M * nv * XV; i += WARPS * 32) {  // stage x[:, slice] while weights fly
      const int m = i / (nv * XV), j = i - m * (nv * XV);
      xs[i] = load_reused(reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * K) + v0 * XV + j);
    }
  }
  __syncthreads();

  float acc[ROWS][M];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  while (true) {
    const int vn = v + 32 * U;
    const bool more = vn < nv;
    if (more) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const bool ok = vn + 32 * u < nv;
          const uint4 t = load_stream(wrow[r] + (ok ? vn + 32 * u : 0));
          nxt[u][r] = ok ? t : zero;
        }
    }
    if constexpr (CHUNKED) {
      if (v - lane >= cb + XCHUNK) {  // `cur` starts the next chunk
        cb += XCHUNK;
        ++ch;
        cp_async_wait<0>();  // this thread's part of chunk ch is in
        __syncthreads();     // everyone's is, and every warp is done with chunk ch - 1
        stage(ch + 1);       // into the buffer chunk ch - 1 has left
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v + 32 * u < nv) {
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const uint4* xv = CHUNKED ? xs + (ch & 1) * XBUF + (m * XCHUNK + v - cb + 32 * u) * XV : xs + (m * nv + v + 32 * u) * XV;
            acc[r][m] = dot_vec<FP8>(cur[u][r], xv, acc[r][m]);
          }
      }
    }
    if (!more) break;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) cur[u][r] = nxt[u][r];
    v = vn;
  }
  if constexpr (CHUNKED) cp_async_wait<0>();  // no copy outlives the loop (the last group is empty: no wait)

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
    cluster_sync();
    if (split == 0) {
      for (int i = threadIdx.x; i < WARPS * ROWS * M; i += WARPS * 32) {
        float s = red[i];
#pragma unroll
        for (int q = 1; q < KSPLIT; ++q) s += load_remote_f32(&red[i], q);  // fixed order: deterministic
        finish(blockIdx.x * (WARPS * ROWS) + i / M, i % M, s);
      }
    }
    cluster_sync();
  }
}

}  // namespace hwp
