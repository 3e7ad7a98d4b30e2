// hwprofile-sm100: hwprofile's skinny-GEMM family (router GEMM, small-M linear, GEMVs) and fused MoE gate for
// Blackwell datacenter GPUs (B200, GB200: sm_100a; B300, GB300: sm_103a), built by NVRTC for exactly those targets.
// Compiled in CI, not yet run on such a GPU: the tile constants are the H200's. What the family uses and why is
// hwprofile/gemv.cuh's; on SM100 its warp-level mma.sync stands where tcgen05/TMEM would: at M <= 16 the
// tensor-core work per weight byte is tiny and the op is a weight stream bound by HBM, so tcgen05's large tiles
// would add set-up, not speed. Clusters of 8 (portable on sm_100) spread a small N over the 148 (GB300: 152) SMs;
// the plan (ArchTuning prefix "hwp100") checks the GEMV's staged x against the same 227 KB as the limits below.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1000) && (__CUDA_ARCH__ != 1030)
#error "hwprofile-sm100 kernels are built for sm_100a / sm_103a only"
#endif
#include <hwprofile/skinny_entry.cuh>
#include <hwprofile/moe_gate.cuh>

namespace hwp100 {
using Limits = hwp::FamilyLimits<227 * 1024>;  // compute capability 10.0 / 10.3: opt-in shared memory per block
}  // namespace hwp100

HWP_SKINNY_GEMM_ENTRY_POINTS(hwp100, hwp100::Limits)
HWP_MOE_GATE_ENTRY_POINT(hwp100, hwp100::Limits)  // ops.moe_gate: the family's GEMM + the selection, one launch
