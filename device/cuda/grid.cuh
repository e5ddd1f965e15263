/*
 * The launch shape of the backend's element-wise kernels (kernels.cu,
 * optimizer.cu): blocks of kBlock threads, a grid-stride loop over any n,
 * counted in size_t so that n may pass INT_MAX.
 */
#ifndef CASTOR_DEVICE_CUDA_GRID_CUH
#define CASTOR_DEVICE_CUDA_GRID_CUH

#include <stddef.h>

namespace castor_grid {

constexpr int kBlock = 256;
/* A grid-stride loop covers any n; more blocks than a few waves of the
 * largest GPU add only scheduling work. */
constexpr size_t kMaxBlocks = 4096;

inline unsigned blocks_for(size_t n)
{
    size_t b = (n + kBlock - 1) / kBlock;
    return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ __forceinline__ size_t grid_start(void)
{
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t grid_stride(void)
{
    return (size_t)gridDim.x * blockDim.x;
}

}  // namespace castor_grid

#endif /* CASTOR_DEVICE_CUDA_GRID_CUH */
