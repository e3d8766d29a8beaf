/*
Lab 5: the page-table lookup inside the paged-attention kernel.

Every kernel of cuda/paged_attention.cu reads a sequence's keys and values through this struct:
rows[pos] must point at the HEAD_DIM values of the token at position pos, for one KV head. You
write operator[]; the check puts your struct into the engine's kernel file in place of its own,
compiles it for the CPU (the emulation: every CUDA thread a fiber, no GPU needed), and compares
decode versions 1 and 5 and the prefill kernel with the NumPy reference; then the model runs
its attention through your lookup.

    python -m minipaged.lab check 5 my_kernel.cu
    python -m minipaged.lab hint 5                     (stuck? the next hint, one at a time)

The cache of one layer is one flat array, [num_blocks, block_size, num_kv_heads, HEAD_DIM] in
row-major order; block_table lists this sequence's frames in logical order (-1 past its end).
Keep the fields and the operator's declaration as they are: the kernels build the struct with
PagedRows<T, HEAD_DIM>{cache, block_table, block_size, num_kv_heads, kv_head}.
*/
template <typename T, int HEAD_DIM>
struct PagedRows {
    const T* cache;              // [num_blocks, block_size, num_kv_heads, HEAD_DIM]
    const int* block_table;      // this sequence's frames, in order
    int block_size, num_kv_heads, kv_head;

    __device__ __forceinline__ const T* operator[](int pos) const {
        // lab 5: three steps, as an MMU translates an address: the frame of pos's logical block
        // (block_table), the slot of pos in the cache (frame * block_size + its offset in the
        // block), and the row of kv_head in that slot. Compute in long long: a large cache has
        // more elements than an int counts. Stuck? python -m minipaged.lab hint 5
        return cache;  // wrong on purpose: every position reads the first row of frame 0
    }
};
