// hwprofile-sm120: skinny GEMM / GEMV kernels for Blackwell workstation and desktop GPUs
// (RTX PRO 6000, RTX 5090: sm_120a; DGX Spark GB10: sm_121a), built by NVRTC for exactly those.
// Shared structure (hwprofile/gemv.cuh). SM12x has no tcgen05/TMEM and only ~99 KB of shared
// memory per block: the plan in hwprofile_sm120 caps the staged x slice at that limit (split-K
// shrinks it), and the kernels use only SIMT FMAs, hardware e4m3 -> f16 conversion (sm_89+) and
// cluster DSMEM (sm_90+), all present on SM12x.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1200) && (__CUDA_ARCH__ != 1210)
#error "hwprofile-sm120 kernels are built for sm_120a / sm_121a only"
#endif
#include <hwprofile/gemv.cuh>
