// The few CUDA features the expert's kernels use, emulated on the CPU so that CI can run them: one std::thread per
// CUDA thread, the blocks of a launch one after another, __syncthreads a barrier of the block, __shfl_xor_sync a
// barrier of the warp around an exchange through memory. Slow and only as faithful as the kernels need (1-D
// launches, warps of 32, a launch's blocks never running at once); tests/test_expert.py compiles the generated
// kernels with it in place of cuda_runtime.h.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define __shared__ static  // one block runs at a time: a static is that block's shared memory

struct dim3 { unsigned x = 0, y = 1, z = 1; };
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
typedef void* cudaStream_t;
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct EmulatedBlock {
    std::unique_ptr<std::barrier<>> all;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<float> lanes;
};
inline EmulatedBlock* emulated_block = nullptr;

inline void __syncthreads() { emulated_block->all->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int offset) {
    const unsigned t = threadIdx.x, warp = t / 32, lane = t % 32;
    emulated_block->lanes[t] = v;
    emulated_block->warps[warp]->arrive_and_wait();
    const float got = emulated_block->lanes[warp * 32 + (lane ^ offset)];
    emulated_block->warps[warp]->arrive_and_wait();
    return got;
}

// kernel<<<grid, threads, 0, stream>>>(args...) becomes emulated_launch(kernel, grid, threads, args...).
template <class Kernel, class... Args>
void emulated_launch(Kernel kernel, unsigned grid, unsigned threads, Args... args) {
    gridDim.x = grid;
    blockDim.x = threads;
    for (unsigned b = 0; b < grid; ++b) {
        EmulatedBlock block;
        block.all = std::make_unique<std::barrier<>>(threads);
        for (unsigned w = 0; w * 32 < threads; ++w)
            block.warps.push_back(std::make_unique<std::barrier<>>(threads - w * 32 < 32 ? threads - w * 32 : 32));
        block.lanes.resize(threads);
        emulated_block = &block;
        std::vector<std::thread> running;
        for (unsigned t = 0; t < threads; ++t)
            running.emplace_back([=] {
                threadIdx.x = t;
                blockIdx.x = b;
                kernel(args...);
            });
        for (auto& thread : running) thread.join();
    }
}
