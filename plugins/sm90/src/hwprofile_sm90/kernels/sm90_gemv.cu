// hwprofile-sm90: skinny GEMM / GEMV kernels for Hopper (H100, H200), built by NVRTC for sm_90a.
//
// What these kernels use, and why (numbers: benchmarks/RESULTS.md, "Kernels"; H200, graph replay):
//  * hwp90_router (router GEMM, small-M linear: bf16 x bf16 -> fp32, M <= 16): the mma.sync
//    m16n8k16 tile of hwprofile/gemv.cuh (the 16 tokens are the MMA rows, so the FLOPs cost
//    nothing), K split over the block's warps and a thread-block cluster of up to 8 blocks. Hopper
//    parts: programmatic dependent launch (griddepcontrol): before waiting on the predecessor grid,
//    warp 0 asks the bulk-copy engine to prefetch the block's weight rows into L2 (safe: a
//    prefetch writes nothing a thread can see, and L2 is the point of coherence); the cluster's
//    ranks push their partial tiles into rank 0 with st.async, counted on rank 0's mbarrier, instead
//    of a second cluster barrier and DSMEM loads; the register use stays low enough for the next
//    launch's blocks to be resident beside this one's. 2.7-3.5 us per call in a chain of calls
//    (3.3-5.0 us without that overlap) against 3.8-5.3 us before.
//  * hwp90_gemv (bf16 GEMV, M = 1, N >= 3 row groups per SM): persistent SIMT kernel, x staged
//    once per block, the register double buffer runs across row groups.
//  * hwp90_gemv_simt: the shared SIMT body (split-K over a 2-block cluster for small N; FP8; and a
//    long K, whose x it streams through shared memory in chunks instead of staging it whole).
// Measured, not dispatched, and kept out of this file (every shipped threshold's stamp digests it):
// hwp90_gemv_bulk, weight streaming by cp.async.bulk into a shared-memory ring (the "TMA" design),
// 1.5-4.0 TB/s against 2.6-3.9 for the SIMT kernels at the same shapes (variants rounds 1-3), lives
// in benchmarks/kernels/sm90_variants.cu for benchmarks/variants_sm90.py.
// Not used, measured: an L2 prefetch before griddepcontrol.wait in the GEMVs (slower at every
// shape: the next call's prefetch evicts lines the running call has yet to read), PDL for the
// GEMVs (no gain), the L2::256B load hint (no gain).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900)
#error "hwprofile-sm90 kernels are built for sm_90a only"
#endif
#include <hwprofile/gemv.cuh>
#include <hwprofile/async.cuh>

namespace hwp90 {

// Hopper limits these kernels rely on (compute capability 9.0).
constexpr int kMaxSharedPerBlock = 227 * 1024;  // opt-in dynamic + static shared memory per block
constexpr int kMaxStaticShared = 48 * 1024;     // static shared memory per block (no opt-in)
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxThreads = 1024;
static_assert(kMaxStaticShared <= kMaxSharedPerBlock, "sm_90 limits (CUDA C++ Programming Guide, compute capability 9.0)");

// ---------------------------------------------------------------------------------------------
// Router GEMM: out[M,N] (fp32) = x[M,K] . w[N,K]^T, M <= 16.
// ---------------------------------------------------------------------------------------------
template <int MT, int WARPS, int NT, int KSPLIT, int U, bool PF, bool PUSH>
__device__ __forceinline__ void router(float* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                       const __nv_bfloat16* __restrict__ w, int M, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= kMaxPortableCluster, "portable cluster sizes on sm_90");
  static_assert(WARPS * 32 <= kMaxThreads, "threads per block");
  constexpr int CK = 32;               // k per chunk: 4 lanes x 8 bf16
  constexpr int TILE = NT * 128;       // accumulator floats per warp
  constexpr int INBOX = KSPLIT > 1 ? (KSPLIT - 1) * TILE : 1;
  static_assert((WARPS * TILE + INBOX + TILE) * 4 + 8 <= kMaxStaticShared, "static shared memory of the reduction");
  __shared__ float red[WARPS * TILE];
  __shared__ float part[KSPLIT > 1 && !PUSH ? TILE : 1];
  __shared__ float inbox[PUSH ? INBOX : 1];  // rank 0: the other ranks' block partials, in rank order
  __shared__ __align__(8) unsigned long long arrived;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * (8 * NT);
  const int kc = (K + CK - 1) / CK;
  const int split = KSPLIT > 1 ? static_cast<int>(hwp::cluster_rank()) : 0;
  const int per = (kc + KSPLIT * WARPS - 1) / (KSPLIT * WARPS);
  const int c0 = min(kc, (split * WARPS + warp) * per), c1 = min(kc, c0 + per);

  if constexpr (PUSH && KSPLIT > 1) {
    if (split == 0 && threadIdx.x == 0) {
      hwp::mbar_init(&arrived, 1);
      hwp::mbar_arrive_expect_tx(&arrived, (KSPLIT - 1) * TILE * 4);
      hwp::mbar_init_fence();
    }
    hwp::cluster_arrive_relaxed();  // waited for before any rank pushes into rank 0's inbox
  }

  const __nv_bfloat16* wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) wrow[j] = w + static_cast<size_t>(min(n0 + 8 * j + g, N - 1)) * K;

  if constexpr (PF) {
    // Warp 0 asks the copy engine for this block's K slice of each of its weight rows (one
    // request per row) before waiting on the predecessor grid. Safe even if the predecessor
    // writes w: a prefetch changes nothing a thread can read, and the loads after
    // griddepcontrol.wait go through L2, the point of coherence.
    const int kb = min(K, split * WARPS * per * CK), ke = min(K, (split + 1) * WARPS * per * CK);
    if (warp == 0 && lane < 8 * NT && n0 + lane < N && ke > kb)
      hwp::prefetch_l2(w + static_cast<size_t>(n0 + lane) * K + kb, static_cast<unsigned>(ke - kb) * 2u);
  }
  hwp::pdl_launch_dependents();
  hwp::pdl_wait();  // x, w and out may belong to the predecessor grid: no thread reads or writes them before

  const bool has0 = g < M, has1 = MT == 2 && g + 8 < M;
  const __nv_bfloat16* x0 = x + static_cast<size_t>(min(g, M - 1)) * K;
  const __nv_bfloat16* x1 = x + static_cast<size_t>(min(g + 8, M - 1)) * K;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int c = c0; c < c1; c += U) {
    uint4 wv[U][NT], xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of the batch issued before any use (clamped, masked)
      const int k = (c + u) * CK + t * 8;
      const bool ok = c + u < c1 && k < K;
      const int kk = ok ? k : 0;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 v = hwp::load_stream(wrow[j] + kk);
        wv[u][j] = ok ? v : zero;
      }
      const uint4 a = hwp::load_reused(x0 + kk);
      xa[u] = ok && has0 ? a : zero;
      if constexpr (MT == 2) {
        const uint4 b = hwp::load_reused(x1 + kk);
        xb[u] = ok && has1 ? b : zero;
      } else {
        xb[u] = zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        hwp::mma_bf16(acc[j], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u][j].x, wv[u][j].y);
        hwp::mma_bf16(acc[j], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u][j].z, wv[u][j].w);
      }
  }

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
  auto block_sum = [&](int i) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) s += red[q * TILE + i];  // fixed order: deterministic
    return s;
  };

  if constexpr (KSPLIT == 1) {
    for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
      int m, n;
      coords(i, m, n);
      if (m < M && n < N) out[static_cast<size_t>(m) * N + n] = block_sum(i);
    }
  } else if constexpr (PUSH) {
    // Ranks 1.. push their block partials into rank 0's inbox with st.async (counted on rank 0's
    // mbarrier) and exit; rank 0 waits for the bytes and sums in rank order: deterministic, and
    // only rank 0 waits at the end.
    hwp::cluster_wait();  // rank 0's mbarrier is initialised
    if (split != 0) {
      const unsigned box = hwp::map_to_rank(hwp::smem_addr(inbox + (split - 1) * TILE), 0);
      const unsigned bar = hwp::map_to_rank(hwp::smem_addr(&arrived), 0);
      for (int i = threadIdx.x; i < TILE; i += WARPS * 32) hwp::st_async_f32(box + 4u * i, block_sum(i), bar);
    } else {
      hwp::mbar_wait(&arrived, 0);
      for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
        int m, n;
        coords(i, m, n);
        if (m >= M || n >= N) continue;
        float s = block_sum(i);
#pragma unroll
        for (int r = 1; r < KSPLIT; ++r) s += inbox[(r - 1) * TILE + i];
        out[static_cast<size_t>(m) * N + n] = s;
      }
    }
  } else {
    for (int i = threadIdx.x; i < TILE; i += WARPS * 32) part[i] = block_sum(i);
    hwp::cluster_sync();  // every rank's block partial is visible
    if (split == 0) {
      for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
        int m, n;
        coords(i, m, n);
        if (m >= M || n >= N) continue;
        float v[KSPLIT];
        v[0] = part[i];
#pragma unroll
        for (int r = 1; r < KSPLIT; ++r) v[r] = hwp::load_remote_f32(&part[i], r);  // all in flight, then summed
        float s = v[0];
#pragma unroll
        for (int r = 1; r < KSPLIT; ++r) s += v[r];
        out[static_cast<size_t>(m) * N + n] = s;
      }
    }
    hwp::cluster_sync();  // keep every rank's shared memory alive until rank 0 has read it
  }
}

// ---------------------------------------------------------------------------------------------
// GEMV M = 1, SIMT, persistent: one warp owns ROWS rows of a row group (WARPS * ROWS rows); each
// warp load reads 512 contiguous bytes of one row (16-byte evict-first loads, the pattern HBM
// streams best). A block walks row groups blockIdx.x, blockIdx.x + gridDim.x, ...: x is staged in
// shared memory once per block, not once per group (restaging it for every group of 8 rows would
// read another 1/8 of the weight bytes from L2), and the register double buffer runs across group
// boundaries, so the next group's first loads are in flight while this group is reduced.
// ---------------------------------------------------------------------------------------------
// LD: 0 = ld.global.cs (evict-first), 1 = ld.global.nc.L1::no_allocate.L2::256B (no L1 line,
// 256-byte L2 fetch granularity).
template <int LD>
__device__ __forceinline__ uint4 load_w(const uint4* p) {
  if constexpr (LD == 0) {
    return hwp::load_stream(p);
  } else {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
  }
}

template <bool FP8, int WARPS, int ROWS, int U, int SCALE, int LD>
__device__ __forceinline__ void gemv_simt(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                          const void* __restrict__ w, const float* __restrict__ scale, int N, int K,
                                          uint4* xs) {
  static_assert(WARPS * 32 <= kMaxThreads, "threads per block");
  constexpr int ESZ = FP8 ? 1 : 2;
  constexpr int VEC = 16 / ESZ;
  constexpr int XV = FP8 ? 2 : 1;
  constexpr int RB = WARPS * ROWS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nv = K / VEC;                  // 16-byte vectors per row
  const int groups = (N + RB - 1) / RB;
  const uint4* wv = static_cast<const uint4*>(w);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  auto rowp = [&](int grp, int r) { return wv + static_cast<size_t>(min(grp * RB + warp * ROWS + r, N - 1)) * nv; };

  hwp::pdl_launch_dependents();
  hwp::pdl_wait();  // x, w and out may belong to the predecessor grid: no thread touches them before
  int grp = blockIdx.x;
  if (grp >= groups) return;

  uint4 cur[U][ROWS], nxt[U][ROWS];
  int vb = 0;  // warp-uniform first vector of the batch in `cur`
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {  // clamped address, masked value: straight-line, all in flight
      const int v = lane + 32 * u;
      const uint4 t = load_w<LD>(rowp(grp, r) + (v < nv ? v : 0));
      cur[u][r] = v < nv ? t : zero;
    }
  for (int i = threadIdx.x; i < nv * XV; i += WARPS * 32) xs[i] = hwp::load_reused(reinterpret_cast<const uint4*>(x) + i);
  __syncthreads();

  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
  while (true) {
    int vn = vb + 32 * U, gn = grp;
    if (vn >= nv) {  // this group's row ends with `cur`: the next batch starts the block's next group
      vn = 0;
      gn = grp + gridDim.x;
    }
    const bool more = gn < groups;
    if (more) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const int v = vn + lane + 32 * u;
          const uint4 t = load_w<LD>(rowp(gn, r) + (v < nv ? v : 0));
          nxt[u][r] = v < nv ? t : zero;
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = vb + lane + 32 * u;
      if (v < nv) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] = hwp::dot_vec<FP8>(cur[u][r], xs + v * XV, acc[r]);
      }
    }
    if (gn != grp) {  // warp-uniform: reduce and store this group's rows
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        const int n = grp * RB + warp * ROWS + r;
        if (lane == r && n < N) {
          float s = acc[r];
          if (SCALE == hwp::kTensorScale) s *= scale[0];
          if (SCALE == hwp::kRowScale) s *= scale[n];
          out[n] = __float2bfloat16_rn(s);
        }
        acc[r] = 0.f;
      }
    }
    if (!more) break;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) cur[u][r] = nxt[u][r];
    vb = vn;
    grp = gn;
  }
}

}  // namespace hwp90

// Entry points. Name expressions:
//   hwp90_router<MT, WARPS, NT, KSPLIT, U, PF, PUSH, MINB>  grid (ceil(N / 8NT), KSPLIT), block WARPS*32
//   hwp90_gemv<FP8, WARPS, ROWS, U, SCALE[, LD]>        grid <= ceil(N / (WARPS*ROWS)) (persistent), dynamic smem = x (K * 2 bytes)
//   hwp90_gemv_simt<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE[, XCHUNK]>  the shared SIMT body (hwprofile/gemv.cuh):
//       split-K over a cluster for small N, the FP8 GEMV, and a K too long to stage x whole (XCHUNK > 0:
//       x streamed through shared memory in chunks); grid (ceil(N / (WARPS*ROWS)), KSPLIT)
// MINB (blocks per SM for __launch_bounds__) caps a thread at 64K / (MINB * WARPS * 32) registers.
// Blocks of the next PDL-launched call can only start beside this call's blocks if registers are
// left: without a cap, ptxas gave the 16-warp tile 90 registers and the overlap was lost (4.5 us
// instead of 3.1, variants round 4); 8-warp tiles use 57-68 registers either way.
template <int MT, int WARPS, int NT, int KSPLIT, int U, bool PF, bool PUSH, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB) __cluster_dims__(1, KSPLIT, 1)
hwp90_router(float* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
             const float* __restrict__ /*scale*/, int M, int N, int K) {
  static_assert(MINB >= 1 && MINB * WARPS * 32 <= 2048, "at most 2048 threads per SM on sm_90");
  hwp90::router<MT, WARPS, NT, KSPLIT, U, PF, PUSH>(out, x, static_cast<const __nv_bfloat16*>(w), M, N, K);
}

template <bool FP8, int WARPS, int ROWS, int U, int SCALE, int LD = 0>
__global__ void __launch_bounds__(WARPS * 32)
hwp90_gemv(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
           const float* __restrict__ scale, int /*M*/, int N, int K) {
  // dynamic shared memory (all of x): hwprofile_sm90.planning.plan_gemv takes this kernel only while two
  // blocks' copies fit the device's shared memory per block (2 blocks per SM), the chunked SIMT kernel past it
  extern __shared__ uint4 hwp90_xs[];
  hwp90::gemv_simt<FP8, WARPS, ROWS, U, SCALE, LD>(out, x, w, scale, N, K, hwp90_xs);
}

template <bool FP8, typename TOut, int M, int WARPS, int ROWS, int KSPLIT, int U, int SCALE, int XCHUNK = 0>
__global__ void __launch_bounds__(WARPS * 32) __cluster_dims__(1, KSPLIT, 1)
hwp90_gemv_simt(TOut* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
                const float* __restrict__ scale, int /*M*/, int N, int K) {
  static_assert(KSPLIT >= 1 && KSPLIT <= hwp90::kMaxPortableCluster, "portable cluster sizes on sm_90");
  static_assert(WARPS * 32 <= hwp90::kMaxThreads, "threads per block");
  static_assert(WARPS * ROWS * M * 4 <= hwp90::kMaxStaticShared, "static shared memory of the split-K reduction");
  // dynamic shared memory (the staged x slice) is checked against 227 KB by hwprofile.kernels.skinny_gemm.plan
  // (the ArchTuning of hwprofile_sm90.planning.tuning)
  extern __shared__ uint4 hwp90_xs[];
  hwp::simt_gemv<FP8, TOut, M, WARPS, ROWS, KSPLIT, U, SCALE, XCHUNK>(out, x, w, scale, N, K, hwp90_xs);
}
