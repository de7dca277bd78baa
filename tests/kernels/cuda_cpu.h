// CPU shim: the subset of CUDA used by cuda/*.cu, so the SAME kernel sources compile with g++ and
// run without a GPU (tests/kernels/test_cpu_kernels.py builds cpu_harness.cpp against it).
//
// Emulated:
//   launch(grid, block, kernel)  blocks run one after another over the 3-D grid; a block's threads
//                                are real std::threads, created once per launch and reused for
//                                every block; 1-D blocks of whole warps (block.x % 32 == 0) only.
//   threadIdx, blockIdx          thread_local; blockDim, gridDim are plain globals.
//   __shared__                   `static`: one copy, shared by the block's threads. Blocks run
//                                sequentially, so one copy serves them all (nothing a correct
//                                kernel relies on carries over between blocks).
//   __syncthreads                a std::barrier over the block's threads.
//   __shfl_xor_sync, __shfl_sync through per-thread scratch slots and a barrier among the warp's
//                                32 threads at every exchange. The mask and width are
//                                ignored: all 32 lanes must call, as the kernels do.
//   __half, __nv_bfloat16        storage-only types (kernels convert through the intrinsics below);
//                                fp16 via _Float16, bf16 via bit ops with round-to-nearest-even.
//   __expf, __fdividef, fmaxf... exact libm (the GPU's fast-math error is not modeled).
// Not emulated: the memory model (a missing __syncthreads may go unnoticed when threads happen to
// run in order), warp-synchronous code without shuffles, partial masks, dynamic shared memory.
#pragma once
#define TURNSTILE_CUDA_CPU 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// ---- half and bfloat16 ----------------------------------------------------------------------
struct __half { _Float16 value; };
struct __nv_bfloat16 { std::uint16_t bits; };
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2);

inline float __half2float(__half h) { return (float)h.value; }
inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }  // libgcc rounds to nearest even
inline float __bfloat162float(__nv_bfloat16 h) {
    std::uint32_t u = std::uint32_t(h.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return __nv_bfloat16{0x7fc0};
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return __nv_bfloat16{std::uint16_t(u >> 16)};
}

// ---- math intrinsics -------------------------------------------------------------------------
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }

// ---- block and warp synchronisation ------------------------------------------------------------
namespace cuda_cpu {
inline std::barrier<>* block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
// Two shuffle slots per thread of the block, used alternately: a lane can write the next
// shuffle's slot as soon as the current exchange's barrier has passed, because every lane has
// then finished reading the slot from the exchange before. One barrier per shuffle.
inline std::vector<std::uint64_t> lanes[2];
inline thread_local unsigned shuffle_parity;

template <typename V> V shuffle_from(V v, unsigned src_lane) {
    static_assert(sizeof(V) <= sizeof(std::uint64_t));
    const unsigned tid = threadIdx.x, warp = tid / 32;
    std::vector<std::uint64_t>& slots = lanes[shuffle_parity ^= 1];
    std::memcpy(&slots[tid], &v, sizeof v);
    warp_barriers[warp]->arrive_and_wait();  // every lane has published
    V r;
    std::memcpy(&r, &slots[warp * 32 + src_lane % 32], sizeof r);
    return r;
}
}  // namespace cuda_cpu

inline void __syncthreads() { cuda_cpu::block_barrier->arrive_and_wait(); }

template <typename V> V __shfl_xor_sync(unsigned /*mask*/, V v, int lane_mask, int /*width*/ = 32) {
    return cuda_cpu::shuffle_from(v, (threadIdx.x % 32) ^ unsigned(lane_mask));
}
template <typename V> V __shfl_sync(unsigned /*mask*/, V v, int src_lane, int /*width*/ = 32) {
    return cuda_cpu::shuffle_from(v, unsigned(src_lane));
}

// ---- kernel launch ------------------------------------------------------------------------------
// Runs `kernel()` (a lambda calling the __global__ function) for every block of `grid`.
template <typename Kernel> void launch(dim3 grid, dim3 block, Kernel kernel) {
    if (block.y != 1 || block.z != 1 || block.x == 0 || block.x % 32 != 0) {
        std::fprintf(stderr, "cuda_cpu: only 1-D blocks of whole warps are emulated\n");
        std::abort();
    }
    gridDim = grid;
    blockDim = block;
    std::barrier<> barrier(block.x);
    cuda_cpu::block_barrier = &barrier;
    cuda_cpu::warp_barriers.clear();
    for (unsigned w = 0; w < block.x / 32; ++w)
        cuda_cpu::warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
    cuda_cpu::lanes[0].assign(block.x, 0);
    cuda_cpu::lanes[1].assign(block.x, 0);
    std::vector<std::thread> threads;
    for (unsigned tid = 0; tid < block.x; ++tid) {
        threads.emplace_back([&, tid] {
            threadIdx = dim3(tid);
            for (unsigned z = 0; z < grid.z; ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; ++x) {
                        blockIdx = dim3(x, y, z);
                        kernel();
                        barrier.arrive_and_wait();  // the block is done before the next one starts
                    }
        });
    }
    for (auto& t : threads) t.join();
}
