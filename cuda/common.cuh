// Shared helpers for the Turnstile CUDA kernels: dtype conversion and block reductions.
//
// NVRTC-clean: no libc headers, only CUDA built-ins plus <cuda_fp16.h> and <cuda_bf16.h> (which
// NVRTC finds through CuPy's include dirs). The CPU check (tests/kernels/cuda_cpu.h) defines
// TURNSTILE_CUDA_CPU and provides __half, __nv_bfloat16 and the four conversion intrinsics used
// below, so kernels must convert only through to_float / from_float, never with half arithmetic.
#pragma once

#ifndef TURNSTILE_CUDA_CPU
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

namespace turnstile {

constexpr int kWarpSize = 32;
// Upper bound on partition_size for paged_attention_partition (its logits live in static shared
// memory); the launcher must check partition_size <= this and partition_size % block_size == 0.
constexpr int kMaxPartitionSize = 512;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

// Block-wide reductions for a 1-D block of NUM_WARPS full warps; every thread must call them and
// every thread gets the result. `scratch` is __shared__ float[NUM_WARPS]; it is free again on
// return (the trailing barrier keeps the next reduction from overwriting values still being read).
template <int NUM_WARPS> __device__ __forceinline__ float block_max(float x, float* scratch) {
    x = warp_max(x);
    if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = x;
    __syncthreads();
    x = scratch[0];
    for (int w = 1; w < NUM_WARPS; ++w) x = fmaxf(x, scratch[w]);
    __syncthreads();
    return x;
}

template <int NUM_WARPS> __device__ __forceinline__ float block_sum(float x, float* scratch) {
    x = warp_sum(x);
    if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = x;
    __syncthreads();
    x = 0.0f;
    for (int w = 0; w < NUM_WARPS; ++w) x += scratch[w];
    __syncthreads();
    return x;
}

}  // namespace turnstile
