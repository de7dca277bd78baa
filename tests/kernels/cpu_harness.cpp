// The CUDA kernels compiled for the CPU (see cuda_cpu.h), with one extern "C" entry point per
// instantiation for ctypes. Built by test_cpu_kernels.py:
//   g++ -O1 -std=c++20 -pthread -shared -fPIC -I cuda -I tests/kernels cpu_harness.cpp
#include "cuda_cpu.h"

#include "reshape_and_cache.cu"
#include "paged_attention.cu"

constexpr int kBlockSize = 16;

#define RESHAPE_AND_CACHE(NAME, T)                                                                 \
    extern "C" void run_reshape_and_cache_##NAME(                                                  \
        const void* key, const void* value, void* key_cache, void* value_cache,                    \
        const long long* slot_mapping, int num_tokens, int num_kv_heads, int head_dim,             \
        int block_size) {                                                                          \
        launch(dim3(num_tokens), dim3(256), [&] {                                                  \
            reshape_and_cache<T>((const T*)key, (const T*)value, (T*)key_cache, (T*)value_cache,   \
                                 slot_mapping, num_kv_heads, head_dim, block_size);                \
        });                                                                                        \
    }

// Runs the partition kernel and then the reduce, as the launcher does.
#define PAGED_ATTENTION(NAME, T, HEAD_DIM)                                                         \
    extern "C" void run_paged_attention_##NAME##_##HEAD_DIM(                                       \
        void* out, float* exp_sums, float* max_logits, float* partial_out, const void* query,      \
        const void* key_cache, const void* value_cache, const long long* block_tables,             \
        const long long* context_lens, int num_seqs, int num_heads, int num_kv_heads,              \
        int max_blocks_per_seq, float scale, int max_num_partitions, int partition_size) {         \
        launch(dim3(num_heads, num_seqs, max_num_partitions), dim3(kPartitionThreads), [&] {       \
            paged_attention_partition<T, HEAD_DIM, kBlockSize>(                                    \
                exp_sums, max_logits, partial_out, (const T*)query, (const T*)key_cache,           \
                (const T*)value_cache, block_tables, context_lens, max_blocks_per_seq, num_heads,  \
                num_kv_heads, scale, max_num_partitions, partition_size);                          \
        });                                                                                        \
        launch(dim3(num_heads, num_seqs), dim3(HEAD_DIM), [&] {                                    \
            paged_attention_reduce<T, HEAD_DIM>((T*)out, exp_sums, max_logits, partial_out,        \
                                                context_lens, num_heads, max_num_partitions,       \
                                                partition_size);                                   \
        });                                                                                        \
    }

RESHAPE_AND_CACHE(f32, float)
RESHAPE_AND_CACHE(f16, __half)
RESHAPE_AND_CACHE(bf16, __nv_bfloat16)
PAGED_ATTENTION(f32, float, 64)
PAGED_ATTENTION(f32, float, 128)
PAGED_ATTENTION(f16, __half, 64)
PAGED_ATTENTION(f16, __half, 128)
PAGED_ATTENTION(bf16, __nv_bfloat16, 64)
PAGED_ATTENTION(bf16, __nv_bfloat16, 128)
