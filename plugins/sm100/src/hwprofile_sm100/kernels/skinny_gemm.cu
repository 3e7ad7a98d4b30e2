// hwprofile-sm100: skinny GEMM / GEMV kernels for Blackwell datacenter GPUs (B200: sm_100a,
// B300/GB300: sm_103a), built by NVRTC for exactly those targets.
// Shared structure (hwprofile/gemv.cuh), checked against this SM's limits: 227 KB opt-in shared
// memory per block, portable clusters of 8. These kernels use no tcgen05/TMEM: at M <= 16 the
// work is a weight stream, bound by HBM bandwidth, not by the tensor cores.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 1000) && (__CUDA_ARCH__ != 1030)
#error "hwprofile-sm100 kernels are built for sm_100a / sm_103a only"
#endif
#include <hwprofile/gemv.cuh>
