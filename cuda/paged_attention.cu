// Paged decode attention: one query token per sequence against its paged K/V context, split over
// context partitions (flash-decoding), then a log-sum-exp reduce over the partitions.
//
//   query           [num_seqs, num_heads, HEAD_DIM]                            T
//   key_cache,
//   value_cache     [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]           T, contiguous
//   block_tables    [num_seqs, max_blocks_per_seq] int64; token t of a sequence is in block
//                   block_tables[seq][t / BLOCK_SIZE], row t % BLOCK_SIZE
//   context_lens    [num_seqs] int64, >= 1
//   exp_sums,
//   max_logits      [num_seqs, num_heads, max_num_partitions]                  fp32
//   partial_out     [num_seqs, num_heads, max_num_partitions, HEAD_DIM]        fp32
//   out             [num_seqs, num_heads, HEAD_DIM]                            T
//
// paged_attention_partition: grid (num_heads, num_seqs, max_num_partitions), block (128).
//   Partition p covers tokens [p * partition_size, min((p + 1) * partition_size, context_len)).
//   It writes m = max logit, s = sum exp(logit - m) and partial_out = softmax-within-partition @ V.
//   Partitions past the context write m = -inf, s = 0 and partial_out = 0.
//   partition_size must be a multiple of BLOCK_SIZE and <= kMaxPartitionSize (512).
// paged_attention_reduce: grid (num_heads, num_seqs), block (HEAD_DIM).
//   out = sum_p w_p * partial_out_p / sum_p w_p with w_p = s_p * exp(m_p - max_p m_p).
//
// GQA: query head h reads kv head h / (num_heads / num_kv_heads). Accumulation is fp32.
// Static shared memory only (no dynamic shared memory to pass at launch). See cuda/README.md.
#include "common.cuh"

constexpr int kPartitionThreads = 128;
constexpr int kPartitionWarps = kPartitionThreads / turnstile::kWarpSize;

template <typename T, int HEAD_DIM, int BLOCK_SIZE>
__global__ void paged_attention_partition(
    float* __restrict__ exp_sums, float* __restrict__ max_logits, float* __restrict__ partial_out,
    const T* __restrict__ query, const T* __restrict__ key_cache, const T* __restrict__ value_cache,
    const long long* __restrict__ block_tables, const long long* __restrict__ context_lens,
    int max_blocks_per_seq, int num_heads, int num_kv_heads, float scale, int max_num_partitions,
    int partition_size) {
    using namespace turnstile;
    static_assert(HEAD_DIM % kWarpSize == 0 && kPartitionThreads % HEAD_DIM == 0, "HEAD_DIM");
    constexpr int DIMS_PER_LANE = HEAD_DIM / kWarpSize;   // QK: a warp per token, lanes over dims
    constexpr int NUM_GROUPS = kPartitionThreads / HEAD_DIM;  // PV: groups of HEAD_DIM threads
    __shared__ float q_s[HEAD_DIM];
    __shared__ float logits[kMaxPartitionSize];  // logits, then exp(logit - max)
    __shared__ float acc_s[NUM_GROUPS][HEAD_DIM];
    __shared__ float scratch[kPartitionWarps];

    const int head = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const long long stat = ((long long)seq * num_heads + head) * max_num_partitions + part;
    float* out = partial_out + stat * HEAD_DIM;

    const int context_len = (int)context_lens[seq];
    const int start = part * partition_size;
    if (start >= context_len) {  // uniform over the block: no barrier is skipped by some threads
        if (tid == 0) {
            max_logits[stat] = neg_inf();
            exp_sums[stat] = 0.0f;
        }
        for (int d = tid; d < HEAD_DIM; d += kPartitionThreads) out[d] = 0.0f;
        return;
    }
    const int end = start + partition_size < context_len ? start + partition_size : context_len;
    const int num_tokens = end - start;
    const int kv_head = head / (num_heads / num_kv_heads);
    const long long* block_table = block_tables + (long long)seq * max_blocks_per_seq;
    const long long slot_stride = (long long)num_kv_heads * HEAD_DIM;  // elements per cache slot
    const long long head_offset = (long long)kv_head * HEAD_DIM;

    const T* q = query + ((long long)seq * num_heads + head) * HEAD_DIM;
    for (int d = tid; d < HEAD_DIM; d += kPartitionThreads) q_s[d] = to_float(q[d]) * scale;
    __syncthreads();
    float q_reg[DIMS_PER_LANE];
    for (int j = 0; j < DIMS_PER_LANE; ++j) q_reg[j] = q_s[lane + j * kWarpSize];

    // 1. Logits: warp w takes tokens w, w + 4, ...; lane reads dims lane + 32 j (coalesced).
    float local_max = neg_inf();
    for (int i = warp; i < num_tokens; i += kPartitionWarps) {
        const int t = start + i;
        const long long slot = block_table[t / BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE;
        const T* k = key_cache + slot * slot_stride + head_offset;
        float dot = 0.0f;
        for (int j = 0; j < DIMS_PER_LANE; ++j) dot += q_reg[j] * to_float(k[lane + j * kWarpSize]);
        dot = warp_sum(dot);  // every lane holds the full dot product
        if (lane == 0) logits[i] = dot;
        local_max = fmaxf(local_max, dot);
    }
    const float max_logit = block_max<kPartitionWarps>(local_max, scratch);  // also publishes logits

    // 2. Softmax numerators and their sum (>= 1: the max token contributes exp(0)).
    float local_sum = 0.0f;
    for (int i = tid; i < num_tokens; i += kPartitionThreads) {
        const float e = __expf(logits[i] - max_logit);
        logits[i] = e;
        local_sum += e;
    }
    const float exp_sum = block_sum<kPartitionWarps>(local_sum, scratch);  // also publishes exps

    // 3. P @ V: group g takes tokens g, g + NUM_GROUPS, ...; thread d of a group reads dim d.
    const int group = tid / HEAD_DIM, d = tid % HEAD_DIM;
    float acc = 0.0f;
    for (int i = group; i < num_tokens; i += NUM_GROUPS) {
        const int t = start + i;
        const long long slot = block_table[t / BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE;
        acc += logits[i] * to_float(value_cache[slot * slot_stride + head_offset + d]);
    }
    acc_s[group][d] = acc;
    __syncthreads();
    if (tid < HEAD_DIM) {
        float sum = 0.0f;
        for (int g = 0; g < NUM_GROUPS; ++g) sum += acc_s[g][tid];
        out[tid] = sum / exp_sum;
    }
    if (tid == 0) {
        max_logits[stat] = max_logit;
        exp_sums[stat] = exp_sum;
    }
}

template <typename T, int HEAD_DIM>
__global__ void paged_attention_reduce(
    T* __restrict__ out, const float* __restrict__ exp_sums, const float* __restrict__ max_logits,
    const float* __restrict__ partial_out, const long long* __restrict__ context_lens,
    int num_heads, int max_num_partitions, int partition_size) {
    using namespace turnstile;
    constexpr int NUM_WARPS = HEAD_DIM / kWarpSize;
    __shared__ float scratch[NUM_WARPS];

    const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
    const int context_len = (int)context_lens[seq];
    const int num_partitions = (context_len + partition_size - 1) / partition_size;  // all live
    const long long stat0 = ((long long)seq * num_heads + head) * max_num_partitions;

    float m = neg_inf();
    for (int p = tid; p < num_partitions; p += HEAD_DIM) m = fmaxf(m, max_logits[stat0 + p]);
    const float global_max = block_max<NUM_WARPS>(m, scratch);

    // Rescale each partition's normalized output by its share of the global softmax denominator.
    float acc = 0.0f, total = 0.0f;
    for (int p = 0; p < num_partitions; ++p) {
        const float w = exp_sums[stat0 + p] * __expf(max_logits[stat0 + p] - global_max);
        total += w;
        acc += w * partial_out[(stat0 + p) * HEAD_DIM + tid];
    }
    out[((long long)seq * num_heads + head) * HEAD_DIM + tid] = from_float<T>(acc / total);
}
