// sm90 kernel variants that were measured and are not dispatched: benchmarks/variants_sm90.py
// compiles them (for sm_90a, with hwprofile's headers on the include path) to re-measure them.
// They live here, not in the plugin's kernels/sm90_gemv.cu, because that file is digested into
// every shipped threshold's stamp: editing a kernel nobody dispatches would mark them all stale.
// The namespace is this file's own, so it also compiles appended to the plugin's source.
//
//  * hwp90_gemv_bulk<FP8, WARPS, KC, STAGES, SCALE>: bf16 / FP8 GEMV at M = 1 (out[N] bf16), weight
//    streaming by cp.async.bulk into a shared-memory ring of STAGES x WARPS x KC bytes (the "TMA"
//    design); persistent grid, block WARPS*32, one warp a row; dynamic shared memory as below.
//    Measured at 1.5-4.0 TB/s against 2.6-3.9 for the SIMT kernels at the same shapes (variants rounds 1-3):
//    it needs >= 128 KB in flight per SM, which leaves no room for a second block or PDL overlap.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900)
#error "the sm90 kernel variants are built for sm_90a only"
#endif
#include <hwprofile/gemv.cuh>
#include <hwprofile/async.cuh>

namespace hwp90_variants {

constexpr int kMaxSharedPerBlock = 227 * 1024;  // sm_90: opt-in dynamic + static shared memory per block

// ---------------------------------------------------------------------------------------------
// GEMV M = 1 by bulk copies: out[N] (bf16) = w[N,K] . x[K] (* scale), fp32 accumulation.
// Dynamic shared memory: [x: K bf16, rounded to 16 B][STAGES x WARPS x KC weight ring][STAGES mbarriers].
// ---------------------------------------------------------------------------------------------
template <bool FP8, int WARPS, int KC, int STAGES, int SCALE>
__device__ __forceinline__ void gemv_bulk(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                          const void* __restrict__ w, const float* __restrict__ scale, int N, int K,
                                          unsigned char* smem) {
  static_assert(KC % 512 == 0 && KC >= 512, "a warp reads 512 bytes per step: 32 lanes x 16 B");
  static_assert(WARPS >= 1 && WARPS <= 32, "warp 0 issues one copy per row: at most 32 rows per stage");
  static_assert(STAGES >= 2, "at least double-buffered");
  static_assert(STAGES * WARPS * KC <= kMaxSharedPerBlock - 16 * 1024, "the ring leaves at least 16 KB of the 227 KB for x");
  constexpr int ESZ = FP8 ? 1 : 2;
  constexpr int STEPS = KC / 512;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t rowbytes = static_cast<size_t>(K) * ESZ;
  const int xbytes = (K * 2 + 15) & ~15;
  uint4* xs = reinterpret_cast<uint4*>(smem);
  unsigned char* ring = smem + xbytes;
  unsigned long long* full = reinterpret_cast<unsigned long long*>(ring + STAGES * WARPS * KC);

  const int groups = (N + WARPS - 1) / WARPS;
  const int mine = groups > static_cast<int>(blockIdx.x) ? (groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int nchunk = static_cast<int>((rowbytes + KC - 1) / KC);
  const int tiles = mine * nchunk;
  const char* wb = static_cast<const char*>(w);

  // tile -> (first row of its group, byte offset in the row, bytes per row)
  auto tile = [&](int ti, int& row0, size_t& off, unsigned& bytes) {
    const int gi = ti / nchunk, c = ti - gi * nchunk;
    row0 = (blockIdx.x + gi * gridDim.x) * WARPS;
    off = static_cast<size_t>(c) * KC;
    bytes = static_cast<unsigned>(min(static_cast<size_t>(KC), rowbytes - off));
  };

  if (warp == 0) {
    if (lane < WARPS) {  // first ring's worth of rows into L2 while the predecessor may still run
      for (int ti = 0; ti < min(STAGES, tiles); ++ti) {
        int row0;
        size_t off;
        unsigned bytes;
        tile(ti, row0, off, bytes);
        if (row0 + lane < N) hwp::prefetch_l2(wb + static_cast<size_t>(row0 + lane) * rowbytes + off, bytes);
      }
    }
    if (lane == 0) {
      for (int s = 0; s < STAGES; ++s) hwp::mbar_init(&full[s], 1);
      hwp::mbar_init_fence();
    }
  }
  hwp::pdl_launch_dependents();
  hwp::pdl_wait();

  auto issue = [&](int ti) {  // warp 0: one bulk copy per valid row of the tile
    int row0;
    size_t off;
    unsigned bytes;
    tile(ti, row0, off, bytes);
    const int s = ti % STAGES;
    const int rows = min(WARPS, N - row0);
    if (lane == 0) hwp::mbar_arrive_expect_tx(&full[s], bytes * rows);
    __syncwarp();
    if (lane < rows)
      hwp::bulk_copy_g2s(ring + (s * WARPS + lane) * KC, wb + static_cast<size_t>(row0 + lane) * rowbytes + off, bytes, &full[s]);
  };
  __syncthreads();  // barriers initialised before warp 0 uses them
  if (warp == 0)
    for (int ti = 0; ti < min(STAGES, tiles); ++ti) issue(ti);
  for (int i = threadIdx.x; i < xbytes / 16; i += WARPS * 32) xs[i] = hwp::load_reused(reinterpret_cast<const uint4*>(x) + i);
  __syncthreads();

  float acc = 0.f;
  for (int ti = 0; ti < tiles; ++ti) {
    int row0;
    size_t off;
    unsigned bytes;
    tile(ti, row0, off, bytes);
    const int s = ti % STAGES;
    hwp::mbar_wait(&full[s], (ti / STAGES) & 1);
    const int row = row0 + warp;
    if (row < N) {
      const uint4* src = reinterpret_cast<const uint4*>(ring + (s * WARPS + warp) * KC);
      const int nv = static_cast<int>(bytes / 16);
      const int xv0 = static_cast<int>(off / 16) * (FP8 ? 2 : 1);  // first x vector of this chunk
#pragma unroll
      for (int q = 0; q < STEPS; ++q) {
        const int v = lane + 32 * q;
        if (v < nv) acc = hwp::dot_vec<FP8>(src[v], xs + xv0 + v * (FP8 ? 2 : 1), acc);
      }
      if (off + bytes == rowbytes) {  // last chunk of the row: reduce and store
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) {
          float r = acc;
          if (SCALE == hwp::kTensorScale) r *= scale[0];
          if (SCALE == hwp::kRowScale) r *= scale[row];
          out[row] = __float2bfloat16_rn(r);
        }
        acc = 0.f;
      }
    }
    __syncthreads();  // every warp is done with stage s: refill it
    if (warp == 0 && ti + STAGES < tiles) issue(ti + STAGES);
  }
}

}  // namespace hwp90_variants

template <bool FP8, int WARPS, int KC, int STAGES, int SCALE>
__global__ void __launch_bounds__(WARPS * 32)
hwp90_gemv_bulk(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
                const float* __restrict__ scale, int /*M*/, int N, int K) {
  extern __shared__ __align__(128) unsigned char hwp90_smem[];
  hwp90_variants::gemv_bulk<FP8, WARPS, KC, STAGES, SCALE>(out, x, w, scale, N, K, hwp90_smem);
}
