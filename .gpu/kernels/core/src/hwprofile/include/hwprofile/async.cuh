// hwprofile shared device code: the asynchronous-copy and launch-ordering primitives of sm_90 and
// later (Hopper, datacenter and workstation Blackwell). Every plugin's targets have them: sm_90a,
// sm_100a, sm_103a, sm_120a, sm_121a. Inline PTX, so the names say exactly which instruction runs.
//
//  * programmatic dependent launch (PDL): griddepcontrol.wait blocks until the grids this one
//    depends on have completed and their memory is visible; it returns at once when the kernel was
//    launched without the programmatic-serialization attribute. launch_dependents lets the next
//    PDL-launched kernel on the stream start its own prologue early.
//  * cp.async.bulk.prefetch.L2: one instruction asks the copy engine to pull a whole contiguous
//    range into L2. It writes no thread-visible state, so it is safe to issue before
//    griddepcontrol.wait (L2 is the point of coherence: a later load sees the predecessor's writes).
//  * cp.async.bulk global -> shared, completing on an mbarrier (transaction bytes): the bulk-copy
//    engine moves the bytes, no register or load instruction per 16 bytes.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "hwprofile/async.cuh needs sm_90 or later (griddepcontrol, cp.async.bulk, mbarrier tx-count)"
#endif

namespace hwp {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Pull [p, p + bytes) into L2; p 16-byte aligned, bytes a multiple of 16 (callers clip ranges).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Make the initialised barriers visible to the copy engine (the async proxy) before first use.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Arrive once and add `bytes` to the transaction count the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Copy `bytes` (multiple of 16, both ends 16-byte aligned) from global to this block's shared
// memory; completion is counted on `bar` as transaction bytes.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// --- thread-block clusters: split arrive/wait, and pushing values into another block's shared memory

// Every thread of every block of the cluster arrives (no ordering of memory: pair it with a fence
// such as mbar_init_fence for what must be visible), and later waits, once per phase.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

// Shared-memory address `addr` (of this block) mapped to the same variable in cluster rank `rank`.
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// Store one float into another block's shared memory; its mbarrier counts the 4 bytes on arrival.
__device__ __forceinline__ void st_async_f32(unsigned remote, float v, unsigned remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
               ::"r"(remote), "f"(v), "r"(remote_bar)
               : "memory");
}

}  // namespace hwp
