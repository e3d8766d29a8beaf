/*
KV-cache writes and copies: the memory side of paging.

    write_kv     after the QKV projection, each new token's K and V rows go to its slot in the
                 cache, slot = frame * block_size + offset, from the runner's slot_mapping
                 (-1 marks a padding token: nothing is written)
    copy_blocks  copy-on-write: for each (src, dst) pair, frame dst becomes a copy of frame src,
                 in K and in V

Layout: k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], T = float or __half.
A slot's num_kv_heads * head_dim values are contiguous, and so are a frame's block_size slots, so
both kernels are plain copies of contiguous runs: consecutive threads touch consecutive elements
(coalesced). The launches are in minipaged/attention/kernels.py.
*/
#include <cuda_fp16.h>

// One block per new token; its threads copy the token's K and V rows of row_size
// (= num_kv_heads * head_dim) values each.
template <typename T>
__global__ void write_kv(T* __restrict__ k_cache, T* __restrict__ v_cache,
                         const T* __restrict__ k,              // [num_tokens, row_size]
                         const T* __restrict__ v,              // [num_tokens, row_size]
                         const int* __restrict__ slot_mapping, // [num_tokens]
                         int row_size) {
    const long long token = blockIdx.x, slot = slot_mapping[token];
    if (slot < 0) return;                                      // a padding token
    for (int i = threadIdx.x; i < row_size; i += blockDim.x) {
        k_cache[slot * row_size + i] = k[token * row_size + i];
        v_cache[slot * row_size + i] = v[token * row_size + i];
    }
}

// One block per copy-on-write pair; frame_size = block_size * num_kv_heads * head_dim values.
// The dst frames are fresh, never a src in the same call, so the blocks need no ordering.
template <typename T>
__global__ void copy_blocks(T* __restrict__ k_cache, T* __restrict__ v_cache,
                            const int* __restrict__ pairs,     // [num_pairs, 2]: (src, dst)
                            int frame_size) {
    const long long src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
    for (int i = threadIdx.x; i < frame_size; i += blockDim.x) {
        k_cache[dst * frame_size + i] = k_cache[src * frame_size + i];
        v_cache[dst * frame_size + i] = v_cache[src * frame_size + i];
    }
}
