// hwprofile-sm120: hwprofile's skinny-GEMM family (router GEMM, small-M linear, GEMVs) and fused MoE gate for
// Blackwell workstation and desktop GPUs (RTX PRO 6000, RTX 5090: sm_120a; DGX Spark GB10: sm_121a), built by NVRTC
// for exactly those targets. Compiled in CI, not yet run on such a GPU: the tile constants are the H200's.
// What the family uses and why is hwprofile/gemv.cuh's; on SM12x, which has no tcgen05/TMEM, its warp-level
// mma.sync is the tensor-core path, and clusters of 8 spread a small N over the SMs (188 on the RTX PRO 6000, 48 on
// DGX Spark). About 99 KB of shared memory per block: the plan (ArchTuning prefix "hwp120") stages the GEMV's x
// whole up to 32 KB and streams it through two 8 KB buffers past that, so no K is too long for it.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1200) && (__CUDA_ARCH__ != 1210)
#error "hwprofile-sm120 kernels are built for sm_120a / sm_121a only"
#endif
#include <hwprofile/skinny_entry.cuh>
#include <hwprofile/moe_gate.cuh>

namespace hwp120 {
using Limits = hwp::FamilyLimits<99 * 1024>;  // compute capability 12.0 / 12.1: opt-in shared memory per block
}  // namespace hwp120

HWP_SKINNY_GEMM_ENTRY_POINTS(hwp120, hwp120::Limits)
HWP_MOE_GATE_ENTRY_POINT(hwp120, hwp120::Limits)  // ops.moe_gate: the family's GEMM + the selection, one launch
