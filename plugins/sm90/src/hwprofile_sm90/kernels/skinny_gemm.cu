// hwprofile-sm90: skinny GEMM / GEMV kernels for Hopper (H100, H200), built by NVRTC for sm_90a.
// The structure is hwprofile's shared one (hwprofile/gemv.cuh); this file pins it to sm_90 and
// checks the tile constants against Hopper's limits: 227 KB opt-in shared memory per block,
// thread-block clusters of up to 8 (portable), 64K registers per SM.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900)
#error "hwprofile-sm90 kernels are built for sm_90a only"
#endif
#include <hwprofile/gemv.cuh>

static_assert(sizeof(uint4) == 16, "16-byte vector loads");
