/* One planted error for each compute-sanitizer tool that scripts/gpu-sanitize
 * runs, so that a clean report of the tool over castor means something: the
 * script runs each canary under its tool first, through Criterion's runner as
 * the GPU tests run (a process per test), and fails unless the tool reports
 * it. Not part of any test suite: every test here passes without the tools. */
#include <criterion/criterion.h>
#include <cuda_runtime.h>

#define CUDA_OK(call) cr_assert_eq((call), cudaSuccess, "%s", #call)

/* memcheck: a write one element past a 32-element allocation. */
__global__ void write_past_end(float *buf, int n) { buf[n] = 1.0f; }

/* racecheck: every thread writes the same shared word, and thread 0 reads it
 * with no barrier between. */
__global__ void shared_race(float *out)
{
    __shared__ float word;
    word = (float)threadIdx.x;
    if (threadIdx.x == 0)
        out[0] = word;
}

/* initcheck: a read of device memory nothing wrote. */
__global__ void read_unwritten(const float *in, float *out) { out[0] = in[0] + 1.0f; }

/* synccheck: a barrier that half of the block never reaches. */
__global__ void divergent_barrier(float *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    out[threadIdx.x] = 0.0f;
}

static float *device_floats(size_t n)
{
    float *p = NULL;
    CUDA_OK(cudaMalloc((void **)&p, n * sizeof *p));
    return p;
}

Test(canary, memcheck)
{
    float *buf = device_floats(32);
    write_past_end<<<1, 1>>>(buf, 32);
    cudaDeviceSynchronize();  /* the tool reports it; the status may say so too */
    cudaFree(buf);
}

Test(canary, racecheck)
{
    float *out = device_floats(1);
    shared_race<<<1, 64>>>(out);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(out));
}

Test(canary, initcheck)
{
    float *in = device_floats(1), *out = device_floats(1);
    read_unwritten<<<1, 1>>>(in, out);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
}

Test(canary, synccheck)
{
    float *out = device_floats(32);
    divergent_barrier<<<1, 32>>>(out);
    cudaDeviceSynchronize();
    cudaFree(out);
}
