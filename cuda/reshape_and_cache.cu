// reshape_and_cache: store the step's new K and V rows at their cache slots.
//
//   key, value      [num_tokens, num_kv_heads, head_dim]               contiguous, T
//   key_cache,
//   value_cache     [num_blocks, block_size, num_kv_heads, head_dim]   contiguous, T
//   slot_mapping    [num_tokens] int64; slot = block * block_size + row; negative: skip the token
//
// grid (num_tokens), block (256): block i copies token i's num_kv_heads * head_dim values of K and
// of V. Because the cache is contiguous, slot * num_kv_heads * head_dim is the row's offset.
// T: float, __half, __nv_bfloat16 (a plain copy; no conversion). See cuda/README.md.
#include "common.cuh"

template <typename T>
__global__ void reshape_and_cache(const T* __restrict__ key, const T* __restrict__ value,
                                  T* __restrict__ key_cache, T* __restrict__ value_cache,
                                  const long long* __restrict__ slot_mapping, int num_kv_heads,
                                  int head_dim, int block_size) {
    const long long token = blockIdx.x;
    const long long slot = slot_mapping[token];
    if (slot < 0) return;  // padding token: the cache is left untouched
    const long long row_size = (long long)num_kv_heads * head_dim;
    // (slot / block_size) * block_size + slot % block_size == slot: the cache row is contiguous.
    const long long src = token * row_size;
    const long long dst = slot * row_size;
    for (long long i = threadIdx.x; i < row_size; i += blockDim.x) {
        key_cache[dst + i] = key[src + i];
        value_cache[dst + i] = value[src + i];
    }
    (void)block_size;  // part of the interface; the flat slot already encodes block and row
}
