/*
Paged attention: attention whose keys and values sit in scattered frames of the KV cache.

A sequence's K and V live in frames of block_size token slots; its block table (one row of
block_tables, padded with -1) lists its frames in order, so the token at position pos sits in
frame block_table[pos / block_size] at offset pos % block_size. Query head h reads KV head
h / (num_heads / num_kv_heads) (grouped-query attention, GQA).

    k_cache, v_cache  [num_blocks, block_size, num_kv_heads, HEAD_DIM]   T = float or __half
    block_tables      int32 [num_seqs, max_blocks]; context_lens int32 [num_seqs]

Decode (one new query per sequence), in numbered versions as in llm.c's dev/cuda: v1 is the
obvious kernel and each later version adds one idea, saying what it buys and what it costs.
    v1  one block per (query head, sequence), one thread per token, logits in global memory
    v2  + coalesced 16-byte loads: the threads of a group share a token
    v3  + warp-shuffle reductions instead of shared memory and barriers
    v4  + online softmax: one pass, no logits buffer that grows with the context
    v5  + one block per GQA group: each K/V element is read once for all its query heads
    v6  + split-KV: long contexts cut into partitions, merged by log-sum-exp
    v7  v5 over an 8-bit cache: int8 codes and an fp16 scale per (slot, KV head), decoded in
        registers (kv_cache_dtype="int8"): about half the bytes of fp16, a quarter of fp32
    write_kv_int8: the new tokens' K/V rows coded into an 8-bit cache (write_kv of cache_ops.cu
        for float and __half caches)
Prefill (many queries per sequence, causal): paged_prefill, and paged_prefill_int8 over an 8-bit
cache, at the end of the file.

Every kernel runs NUM_THREADS = 128 threads per block and accumulates in fp32; HEAD_DIM is 64 or
128; block_size is any value (8, 16 and 32 are tested); positions past a context are never read.
The launches (grids, arguments, which version when) are in minipaged/attention/kernels.py.

    compile check (NVRTC, sm_80 and sm_90, no GPU)   pytest tests/test_kernels_compile.py
    this code on the CPU vs the NumPy reference      pytest tests/test_kernels_emulated.py
    GB/s and % of peak per version (on a GPU)        python -m minipaged.bench kernel
*/
#include <cuda_fp16.h>

constexpr int WARP_SIZE = 32;
constexpr int NUM_THREADS = 128;                  // every kernel here: 4 warps per block
constexpr int NUM_WARPS = NUM_THREADS / WARP_SIZE;
constexpr unsigned FULL_MASK = 0xffffffffu;       // all 32 lanes take part in each shuffle
// Below any real logit. Finite on purpose: exp(NEG_BIG - NEG_BIG) is 1, where exp(-inf - -inf)
// would be NaN, so a softmax state that has seen no token yet needs no special case.
constexpr float NEG_BIG = -1e30f;

// ---- conversions, 16-byte loads, the block table lookup -----------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(signed char x) { return (float)x; }   // an int8 code
__device__ __forceinline__ void store(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void store(__half* dst, float x) { *dst = __float2half(x); }

// 16 bytes, the widest load a thread can issue in one instruction: 4 floats or 8 halves.
template <typename T>
struct alignas(16) Packed16 {
    static constexpr int SIZE = 16 / sizeof(T);
    T x[SIZE];
};

template <typename T>
__device__ __forceinline__ Packed16<T> load16(const T* src) {
    return *reinterpret_cast<const Packed16<T>*>(src);
}

template <typename T>
__device__ __forceinline__ void unpack(const Packed16<T>& packed, float* dst) {
    for (int i = 0; i < Packed16<T>::SIZE; i++) dst[i] = to_float(packed.x[i]);
}

template <int N>
__device__ __forceinline__ float dot(const float (&a)[N], const float (&b)[N]) {
    float sum = 0.0f;
    for (int i = 0; i < N; i++) sum += a[i] * b[i];
    return sum;
}

// One sequence's K (or V) rows for one KV head, seen through its block table: rows[pos] points
// at the HEAD_DIM values of the token at position pos. The page pos / block_size is looked up in
// the block table (the page table); the token sits at offset pos % block_size of that frame.
template <typename T, int HEAD_DIM>
struct PagedRows {
    const T* cache;              // [num_blocks, block_size, num_kv_heads, HEAD_DIM]
    const int* block_table;      // this sequence's frames, in order
    int block_size, num_kv_heads, kv_head;

    __device__ __forceinline__ const T* operator[](int pos) const {
        const long long frame = block_table[pos / block_size];
        const long long slot = frame * block_size + pos % block_size;
        return cache + (slot * num_kv_heads + kv_head) * HEAD_DIM;
    }
};

// ---- reductions ---------------------------------------------------------------------------------

struct Max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct Sum { __device__ float operator()(float a, float b) const { return a + b; } };

// v1, v2: a block-wide reduction as a tree in shared memory: log2(128) = 7 halving rounds, each
// closed by a barrier of the whole block.
template <typename Op>
__device__ float block_reduce_tree(float x, Op op) {
    __shared__ float buf[NUM_THREADS];
    buf[threadIdx.x] = x;
    __syncthreads();
    for (int stride = NUM_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride)
            buf[threadIdx.x] = op(buf[threadIdx.x], buf[threadIdx.x + stride]);
        __syncthreads();
    }
    const float result = buf[0];
    __syncthreads();                                 // buf is reused by the next reduction
    return result;
}

// v3+: combine x over the lanes whose indices differ only in the bits FIRST, 2 FIRST, .., LAST / 2.
// Each step swaps registers with the lane `mask` away (__shfl_xor_sync): no shared memory, no
// barrier, and afterwards every lane holds the result. <1, 8> reduces over 8 neighbouring lanes;
// <8, 32> over the lanes at the same place in the 4 groups of 8 of a warp.
template <int FIRST, int LAST, typename Op>
__device__ __forceinline__ float butterfly(float x, Op op) {
    for (int mask = FIRST; mask < LAST; mask *= 2) x = op(x, __shfl_xor_sync(FULL_MASK, x, mask));
    return x;
}

// v3: a block-wide reduction: a butterfly in each warp, then one value per warp through shared
// memory. Two barriers instead of the tree's nine.
template <typename Op>
__device__ float block_reduce_warps(float x, Op op) {
    __shared__ float per_warp[NUM_WARPS];
    x = butterfly<1, WARP_SIZE>(x, op);
    if (threadIdx.x % WARP_SIZE == 0) per_warp[threadIdx.x / WARP_SIZE] = x;
    __syncthreads();
    x = per_warp[0];
    for (int w = 1; w < NUM_WARPS; w++) x = op(x, per_warp[w]);
    __syncthreads();                                 // per_warp is reused by the next reduction
    return x;
}

// v1-v3, the middle pass: replace the logits s[0..n) by exp(s - max); return this thread's part
// of their sum.
__device__ float exp_logits(float* s, int n, float max) {
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += NUM_THREADS) {
        s[t] = expf(s[t] - max);
        sum += s[t];
    }
    return sum;
}

// v2+: this lane's 16-byte slice of a query row, as floats, times the softmax scale.
template <typename T>
__device__ __forceinline__ void load_scaled(const T* src, float scale, float* dst) {
    unpack(load16(src), dst);
    for (int i = 0; i < Packed16<T>::SIZE; i++) dst[i] *= scale;
}

// ================================================================================================
// v1: the obvious kernel.
// One block per (query head, sequence). Thread t takes tokens t, t+128, ...: it looks up each
// token's frame in the block table, computes the logit q.k reading the key one element at a time,
// and writes it to `logits`, a buffer in global memory with room for max_context tokens per
// (sequence, head). Tree reductions find the max and the sum of the exponentials; then thread d
// computes output element d by walking over all the tokens.
// Cost: in each load instruction the 32 threads of a warp read 32 different key rows, one
// element each (uncoalesced: many transactions, few bytes used from each); the logits make two
// round trips through global memory, more as the context grows; each reduction takes 9 barriers;
// the query heads of a GQA group each read the same K/V again; and a (head, sequence) gets one
// SM however long its context.
template <typename T, int HEAD_DIM>
__global__ void paged_attention_v1(
    T* __restrict__ out,                   // [num_seqs, num_heads, HEAD_DIM]
    const T* __restrict__ q,               // [num_seqs, num_heads, HEAD_DIM]
    const T* __restrict__ k_cache,         // [num_blocks, block_size, num_kv_heads, HEAD_DIM]
    const T* __restrict__ v_cache,         // [num_blocks, block_size, num_kv_heads, HEAD_DIM]
    const int* __restrict__ block_tables,  // [num_seqs, max_blocks]
    const int* __restrict__ context_lens,  // [num_seqs]
    int max_blocks, int block_size, int num_kv_heads, float scale,
    float* __restrict__ logits,            // [num_seqs, num_heads, max_context], scratch
    int max_context) {
    const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
    const int kv_head = head / (num_heads / num_kv_heads), context_len = context_lens[seq];
    const long long row = (long long)seq * num_heads + head;          // of q, out and logits
    const PagedRows<T, HEAD_DIM> keys{k_cache, block_tables + seq * max_blocks, block_size,
                                      num_kv_heads, kv_head};
    const PagedRows<T, HEAD_DIM> values{v_cache, keys.block_table, block_size, num_kv_heads,
                                        kv_head};
    float* s = logits + row * max_context;

    // 1. logits s[t] = scale * q.k_t, one token per thread
    float thread_max = NEG_BIG;
    for (int t = threadIdx.x; t < context_len; t += NUM_THREADS) {
        float qk = 0.0f;
        for (int d = 0; d < HEAD_DIM; d++)
            qk += to_float(q[row * HEAD_DIM + d]) * to_float(keys[t][d]);
        s[t] = qk * scale;
        thread_max = fmaxf(thread_max, s[t]);
    }
    const float max = block_reduce_tree(thread_max, Max());
    // 2. softmax numerators and their sum
    const float sum = block_reduce_tree(exp_logits(s, context_len, max), Sum());
    // 3. out[d] = sum over t of s[t] * v_t[d] / sum, one element per thread
    for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < context_len; t++) acc += s[t] * to_float(values[t][d]);
        store(out + row * HEAD_DIM + d, acc / sum);
    }
}

// ================================================================================================
// v2: coalesced 16-byte loads (+ v1).
// LANES = HEAD_DIM / (16 / sizeof(T)) neighbouring threads, a group, share a token: each loads 16
// contiguous bytes of the key row in one instruction, so a warp reads whole rows (every 32-byte
// sector it touches is used in full) with 4 to 8 times fewer load instructions. The block works
// on GROUPS = 128 / LANES tokens at once. The same for V in the last pass: each group adds up
// p * v over its tokens for its lanes' 16-byte slices; the groups' sums meet in shared memory.
// Cost: the LANES partial dot products of a token must be added up. Here that goes through shared
// memory, with two barriers of the whole block for every GROUPS tokens.
template <typename T, int HEAD_DIM>
__global__ void paged_attention_v2(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ block_tables,
    const int* __restrict__ context_lens, int max_blocks, int block_size, int num_kv_heads,
    float scale, float* __restrict__ logits, int max_context) {
    constexpr int VEC = Packed16<T>::SIZE;           // elements in one 16-byte load
    constexpr int LANES = HEAD_DIM / VEC;            // threads per token
    constexpr int GROUPS = NUM_THREADS / LANES;      // tokens in flight in the block
    const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
    const int kv_head = head / (num_heads / num_kv_heads), context_len = context_lens[seq];
    const long long row = (long long)seq * num_heads + head;
    const PagedRows<T, HEAD_DIM> keys{k_cache, block_tables + seq * max_blocks, block_size,
                                      num_kv_heads, kv_head};
    const PagedRows<T, HEAD_DIM> values{v_cache, keys.block_table, block_size, num_kv_heads,
                                        kv_head};
    float* s = logits + row * max_context;
    const int group = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    float q_vec[VEC];                                // this lane's slice of q
    load_scaled(q + row * HEAD_DIM + lane * VEC, scale, q_vec);

    // 1. logits, GROUPS tokens at a time; the first lane of a group adds up its token's partials
    __shared__ float partials[NUM_THREADS];
    float thread_max = NEG_BIG;
    for (int first = 0; first < context_len; first += GROUPS) {   // one trip count for all threads
        const int t = first + group;
        float k_vec[VEC];
        partials[threadIdx.x] = 0.0f;
        if (t < context_len) {
            unpack(load16(keys[t] + lane * VEC), k_vec);
            partials[threadIdx.x] = dot(q_vec, k_vec);
        }
        __syncthreads();
        if (lane == 0 && t < context_len) {
            float qk = 0.0f;
            for (int i = 0; i < LANES; i++) qk += partials[threadIdx.x + i];
            s[t] = qk;
            thread_max = fmaxf(thread_max, qk);
        }
        __syncthreads();
    }
    const float max = block_reduce_tree(thread_max, Max());
    // 2. softmax numerators and their sum
    const float sum = block_reduce_tree(exp_logits(s, context_len, max), Sum());
    // 3. each group adds up s[t] * v_t over its tokens, 16 bytes per lane; then the groups' sums
    __shared__ float group_acc[GROUPS][HEAD_DIM];
    float acc[VEC] = {}, v_vec[VEC];
    for (int t = group; t < context_len; t += GROUPS) {
        unpack(load16(values[t] + lane * VEC), v_vec);
        for (int i = 0; i < VEC; i++) acc[i] += s[t] * v_vec[i];
    }
    for (int i = 0; i < VEC; i++) group_acc[group][lane * VEC + i] = acc[i];
    __syncthreads();
    for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
        float total = 0.0f;
        for (int g = 0; g < GROUPS; g++) total += group_acc[g][d];
        store(out + row * HEAD_DIM + d, total / sum);
    }
}

// ================================================================================================
// v3: warp-shuffle reductions (+ v2).
// A token's LANES lanes sit in one warp, so its partial dot products are added by a butterfly of
// log2(LANES) shuffles, register to register. The block max and sum become a butterfly per warp
// plus one shared value per warp (2 barriers instead of 9), and the groups' p * v sums are added
// across each warp by shuffles, leaving 4 rows for shared memory. With no barrier left in the
// token loop, each warp goes through its tokens at its own pace.
// Cost: all 32 lanes must take part in every shuffle, so a warp's loop runs the same number of
// times for all its lanes (a token past the end contributes 0). The logits still make their round
// trips through global memory, and K and V are read in separate passes.
template <typename T, int HEAD_DIM>
__global__ void paged_attention_v3(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ block_tables,
    const int* __restrict__ context_lens, int max_blocks, int block_size, int num_kv_heads,
    float scale, float* __restrict__ logits, int max_context) {
    constexpr int VEC = Packed16<T>::SIZE;
    constexpr int LANES = HEAD_DIM / VEC;
    constexpr int GROUPS = NUM_THREADS / LANES;
    constexpr int GROUPS_PER_WARP = WARP_SIZE / LANES;
    const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
    const int kv_head = head / (num_heads / num_kv_heads), context_len = context_lens[seq];
    const long long row = (long long)seq * num_heads + head;
    const PagedRows<T, HEAD_DIM> keys{k_cache, block_tables + seq * max_blocks, block_size,
                                      num_kv_heads, kv_head};
    const PagedRows<T, HEAD_DIM> values{v_cache, keys.block_table, block_size, num_kv_heads,
                                        kv_head};
    float* s = logits + row * max_context;
    const int warp = threadIdx.x / WARP_SIZE;
    const int group = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    float q_vec[VEC];
    load_scaled(q + row * HEAD_DIM + lane * VEC, scale, q_vec);

    // 1. logits: the same tokens per group as v2; `first` is the same for the whole warp
    float thread_max = NEG_BIG;
    for (int first = warp * GROUPS_PER_WARP; first < context_len; first += GROUPS) {
        const int t = first + group % GROUPS_PER_WARP;
        float k_vec[VEC], partial = 0.0f;
        if (t < context_len) {
            unpack(load16(keys[t] + lane * VEC), k_vec);
            partial = dot(q_vec, k_vec);
        }
        const float qk = butterfly<1, LANES>(partial, Sum());
        if (t < context_len) {
            if (lane == 0) s[t] = qk;
            thread_max = fmaxf(thread_max, qk);
        }
    }
    const float max = block_reduce_warps(thread_max, Max());
    // 2. softmax numerators and their sum
    const float sum = block_reduce_warps(exp_logits(s, context_len, max), Sum());
    // 3. p * v per group as in v2, then added over the groups of a warp by shuffles
    __shared__ float warp_acc[NUM_WARPS][HEAD_DIM];
    float acc[VEC] = {}, v_vec[VEC];
    for (int t = group; t < context_len; t += GROUPS) {
        unpack(load16(values[t] + lane * VEC), v_vec);
        for (int i = 0; i < VEC; i++) acc[i] += s[t] * v_vec[i];
    }
    for (int i = 0; i < VEC; i++) acc[i] = butterfly<LANES, WARP_SIZE>(acc[i], Sum());
    if (group % GROUPS_PER_WARP == 0)
        for (int i = 0; i < VEC; i++) warp_acc[warp][lane * VEC + i] = acc[i];
    __syncthreads();
    for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
        float total = 0.0f;
        for (int w = 0; w < NUM_WARPS; w++) total += warp_acc[w][d];
        store(out + row * HEAD_DIM + d, total / sum);
    }
}

// ---- online softmax (v4+) -----------------------------------------------------------------------
// A softmax state summarizes the tokens seen so far: m, the largest logit; l, the sum of
// exp(logit - m); acc, the sum of exp(logit - m) * v. Tokens are folded in one at a time, and
// two states are merged by rescaling both to the larger max (Milakov & Gimelshein 2018, "Online
// normalizer calculation for softmax"; the same trick drives FlashAttention). Output: acc / l.

template <int N>
__device__ __forceinline__ void online_update(float& m, float& l, float (&acc)[N], float logit,
                                              const float (&v)[N]) {
    const float m_new = fmaxf(m, logit);
    const float rescale = expf(m - m_new);           // 1 if the max stayed; 0 for the first token
    const float p = expf(logit - m_new);
    l = l * rescale + p;
    for (int i = 0; i < N; i++) acc[i] = acc[i] * rescale + p * v[i];
    m = m_new;
}

// Merge the states of the groups of a warp (the lanes at the same place in each group hold the
// same slice of acc). Afterwards every group holds the warp's state.
template <int LANES, int VEC>
__device__ void merge_groups_in_warp(float& m, float& l, float (&acc)[VEC]) {
    const float m_warp = butterfly<LANES, WARP_SIZE>(m, Max());
    const float rescale = expf(m - m_warp);
    l = butterfly<LANES, WARP_SIZE>(l * rescale, Sum());
    for (int i = 0; i < VEC; i++) acc[i] = butterfly<LANES, WARP_SIZE>(acc[i] * rescale, Sum());
    m = m_warp;
}

// Merge the 4 warps' states through shared memory and write one head's output acc / l to
// out_row. Returns the log-sum-exp of the head's logits, m + log(l) (v6 merges partitions by it).
template <int HEAD_DIM, int LANES, int VEC, typename OutT>
__device__ float merge_warps_and_store(float m, float l, const float (&acc)[VEC], OutT* out_row) {
    __shared__ float warp_m[NUM_WARPS], warp_l[NUM_WARPS], warp_acc[NUM_WARPS][HEAD_DIM];
    const int warp = threadIdx.x / WARP_SIZE, lane_in_warp = threadIdx.x % WARP_SIZE;
    if (lane_in_warp < LANES) {                      // the warp's first group speaks for it
        for (int i = 0; i < VEC; i++) warp_acc[warp][lane_in_warp * VEC + i] = acc[i];
        if (lane_in_warp == 0) {
            warp_m[warp] = m;
            warp_l[warp] = l;
        }
    }
    __syncthreads();
    float m_all = NEG_BIG, l_all = 0.0f;
    for (int w = 0; w < NUM_WARPS; w++) m_all = fmaxf(m_all, warp_m[w]);
    for (int w = 0; w < NUM_WARPS; w++) l_all += warp_l[w] * expf(warp_m[w] - m_all);
    for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
        float total = 0.0f;
        for (int w = 0; w < NUM_WARPS; w++) total += warp_acc[w][d] * expf(warp_m[w] - m_all);
        store(out_row + d, total / l_all);
    }
    __syncthreads();                                 // the arrays are reused by the next head
    return m_all + logf(l_all);
}

// The work of one block from v4 on: the Q_PER_KV query heads q_rows[0..Q_PER_KV) that share one
// KV head attend to the positions [begin, end) of one sequence, in one pass over its keys and
// values, with a softmax state per head. Tokens go to groups of LANES lanes as in v3; a token's K
// and V rows are loaded together, so their latencies overlap. Head g's output goes to
// out_rows + g * HEAD_DIM and, if lse is given, its log-sum-exp to lse[g].
// v4 calls this with Q_PER_KV = 1, once per query head; v5 once per GQA group, so that each K/V
// row loaded serves all the group's heads; v6 once per partition of the context.
template <typename T, int HEAD_DIM, int Q_PER_KV, typename OutT>
__device__ void attend(const T* q_rows, PagedRows<T, HEAD_DIM> keys, PagedRows<T, HEAD_DIM> values,
                       float scale, int begin, int end, OutT* out_rows, float* lse) {
    constexpr int VEC = Packed16<T>::SIZE;
    constexpr int LANES = HEAD_DIM / VEC;
    constexpr int GROUPS = NUM_THREADS / LANES;
    constexpr int GROUPS_PER_WARP = WARP_SIZE / LANES;
    const int warp = threadIdx.x / WARP_SIZE;
    const int group = threadIdx.x / LANES, lane = threadIdx.x % LANES;

    // All in registers: every loop over g (or i) is unrolled, so no index is dynamic.
    float q_vec[Q_PER_KV][VEC], m[Q_PER_KV], l[Q_PER_KV], acc[Q_PER_KV][VEC] = {};
#pragma unroll
    for (int g = 0; g < Q_PER_KV; g++) {
        load_scaled(q_rows + g * HEAD_DIM + lane * VEC, scale, q_vec[g]);
        m[g] = NEG_BIG;
        l[g] = 0.0f;
    }
    for (int first = begin + warp * GROUPS_PER_WARP; first < end; first += GROUPS) {  // per warp
        const int t = first + group % GROUPS_PER_WARP;
        float k_vec[VEC], v_vec[VEC];
        if (t < end) {
            unpack(load16(keys[t] + lane * VEC), k_vec);
            unpack(load16(values[t] + lane * VEC), v_vec);
        }
#pragma unroll
        for (int g = 0; g < Q_PER_KV; g++) {
            const float logit = butterfly<1, LANES>(t < end ? dot(q_vec[g], k_vec) : 0.0f, Sum());
            if (t < end) online_update(m[g], l[g], acc[g], logit, v_vec);
        }
    }
#pragma unroll
    for (int g = 0; g < Q_PER_KV; g++) {
        merge_groups_in_warp<LANES>(m[g], l[g], acc[g]);
        const float head_lse = merge_warps_and_store<HEAD_DIM, LANES>(m[g], l[g], acc[g],
                                                                        out_rows + g * HEAD_DIM);
        if (lse != nullptr && threadIdx.x == 0) lse[g] = head_lse;
    }
}

// ================================================================================================
// v4: online softmax (+ v3).
// One pass over the context instead of three: each group folds its tokens into a softmax state
// (see online_update), and the states are merged at the end, within a warp by shuffles, across
// warps in shared memory. No logits buffer: the kernel's memory traffic is K, V, q and out, and
// nothing that grows with the context. Still one block per (query head, sequence).
// Cost: one more exp per token and head (the rescale), cheap next to the loads. The query heads
// of a GQA group still each read the same K/V.
template <typename T, int HEAD_DIM>
__global__ void paged_attention_v4(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ block_tables,
    const int* __restrict__ context_lens, int max_blocks, int block_size, int num_kv_heads,
    float scale) {
    const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
    const int kv_head = head / (num_heads / num_kv_heads);
    const long long row = (long long)seq * num_heads + head;
    const int* block_table = block_tables + seq * max_blocks;
    attend<T, HEAD_DIM, 1>(q + row * HEAD_DIM,
                           {k_cache, block_table, block_size, num_kv_heads, kv_head},
                           {v_cache, block_table, block_size, num_kv_heads, kv_head},
                           scale, 0, context_lens[seq], out + row * HEAD_DIM, nullptr);
}

// ================================================================================================
// v5: one block per GQA group (+ v4).
// The Q_PER_KV = num_heads / num_kv_heads query heads of a group read the same K/V. One block now
// serves a whole group: each K/V row is loaded once into registers and used for Q_PER_KV dot
// products and softmax updates, so K/V traffic drops Q_PER_KV-fold (3x for SmolLM2, 4x for
// Llama 3 8B). Each lane keeps q, m, l and acc for every head of the group.
// Cost: Q_PER_KV times the registers and shuffles per token, and Q_PER_KV times fewer blocks
// (num_seqs * num_kv_heads), which leaves most SMs idle when there are few sequences (v6).
template <typename T, int HEAD_DIM, int Q_PER_KV>
__global__ void paged_attention_v5(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ block_tables,
    const int* __restrict__ context_lens, int max_blocks, int block_size, int num_kv_heads,
    float scale) {
    const int kv_head = blockIdx.x, seq = blockIdx.y;
    const long long first_row = ((long long)seq * num_kv_heads + kv_head) * Q_PER_KV;  // 1st head
    const int* block_table = block_tables + seq * max_blocks;
    attend<T, HEAD_DIM, Q_PER_KV>(q + first_row * HEAD_DIM,
                                  {k_cache, block_table, block_size, num_kv_heads, kv_head},
                                  {v_cache, block_table, block_size, num_kv_heads, kv_head},
                                  scale, 0, context_lens[seq], out + first_row * HEAD_DIM, nullptr);
}

// ================================================================================================
// v6: split-KV (+ v5), for few sequences with long contexts.
// v5 runs num_seqs * num_kv_heads blocks: 8 for one Llama 3 8B sequence, on a GPU with 132 SMs.
// v6 also cuts each context into partitions of partition_size tokens, one block each (grid z),
// so that a single long sequence fills the GPU. A block writes its partition's output acc / l and
// log-sum-exp m + log(l), in fp32; paged_attention_v6_reduce then merges the partitions:
//     out = sum_p exp(lse_p - lse_max) * out_p / sum_p exp(lse_p - lse_max).
// Cost: a second launch, and num_partitions * HEAD_DIM floats per head through global memory;
// no gain when v5 already fills the GPU (the rule in minipaged/attention/kernels.py says when).
template <typename T, int HEAD_DIM, int Q_PER_KV>
__global__ void paged_attention_v6(
    float* __restrict__ part_out,          // [num_seqs, num_partitions, num_heads, HEAD_DIM]
    float* __restrict__ part_lse,          // [num_seqs, num_partitions, num_heads]
    const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ context_lens, int max_blocks,
    int block_size, int num_kv_heads, float scale, int partition_size) {
    const int kv_head = blockIdx.x, seq = blockIdx.y, partition = blockIdx.z;
    const int begin = partition * partition_size;
    const int end = min(begin + partition_size, context_lens[seq]);
    if (begin >= end) return;                        // past the sequence's end: the block leaves
    const long long first_row = ((long long)seq * num_kv_heads + kv_head) * Q_PER_KV;
    const long long part_row = ((long long)seq * gridDim.z + partition) * num_kv_heads * Q_PER_KV +
                               kv_head * Q_PER_KV;
    const int* block_table = block_tables + seq * max_blocks;
    attend<T, HEAD_DIM, Q_PER_KV>(q + first_row * HEAD_DIM,
                                  {k_cache, block_table, block_size, num_kv_heads, kv_head},
                                  {v_cache, block_table, block_size, num_kv_heads, kv_head},
                                  scale, begin, end, part_out + part_row * HEAD_DIM,
                                  part_lse + part_row);
}

// One block per (query head, sequence): merge the sequence's partitions by their log-sum-exp.
template <typename T, int HEAD_DIM>
__global__ void paged_attention_v6_reduce(
    T* __restrict__ out, const float* __restrict__ part_out, const float* __restrict__ part_lse,
    const int* __restrict__ context_lens, int partition_size, int num_partitions) {
    const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
    const int used = (context_lens[seq] + partition_size - 1) / partition_size;
    const long long first = (long long)seq * num_partitions * num_heads + head;  // partition 0's row
    const float* lse = part_lse + first;
    const float* part = part_out + first * HEAD_DIM;
    float lse_max = NEG_BIG, weight_sum = 0.0f;
    for (int p = 0; p < used; p++) lse_max = fmaxf(lse_max, lse[p * num_heads]);
    for (int p = 0; p < used; p++) weight_sum += expf(lse[p * num_heads] - lse_max);
    for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
        float total = 0.0f;
        for (int p = 0; p < used; p++)
            total += expf(lse[p * num_heads] - lse_max) * part[p * num_heads * HEAD_DIM + d];
        store(out + ((long long)seq * num_heads + head) * HEAD_DIM + d, total / weight_sum);
    }
}

// ================================================================================================
// v7: an 8-bit KV cache (+ v5).
// k_cache and v_cache hold int8 codes; k_scales, v_scales [num_blocks, block_size, num_kv_heads]
// one __half per (slot, KV head): value = code * scale (minipaged/attention/reference.py codes
// them in write_kv), found through the same block table entry as the codes. Decoding happens here,
// in registers, after the load: the bytes that cross the memory bus are the 8-bit codes, so a
// memory-bound decode reads half of fp16's bytes. (Decoding into a float buffer before the kernel,
// as SGLang warns, would pay that buffer's writes and reads and lose the gain.) K's scale is taken
// out of the dot product, q . (code * s) = s * (q . code): one multiply per token, not per element.
// Lanes take 8 codes each (an 8-byte load), so a lane's registers hold as many values as in the
// fp16 kernel and 8 query heads per group still fit without spilling.
// Cost: two 2-byte scale loads per token (3% more bytes at HEAD_DIM 64), and the rounding error of
// 8 bits: at most half a step, 1/254 of the row's largest |value|.
constexpr int CODES_PER_LOAD = 8;

struct alignas(8) Codes8 {
    signed char x[CODES_PER_LOAD];
};

__device__ __forceinline__ void load_codes(const signed char* src, float scale, float* dst) {
    const Codes8 codes = *reinterpret_cast<const Codes8*>(src);
    for (int i = 0; i < CODES_PER_LOAD; i++) dst[i] = to_float(codes.x[i]) * scale;
}

template <typename T, int HEAD_DIM, int Q_PER_KV>
__global__ void paged_attention_v7(
    T* __restrict__ out, const T* __restrict__ q, const signed char* __restrict__ k_cache,
    const signed char* __restrict__ v_cache, const __half* __restrict__ k_scales,
    const __half* __restrict__ v_scales, const int* __restrict__ block_tables,
    const int* __restrict__ context_lens, int max_blocks, int block_size, int num_kv_heads,
    float scale) {
    constexpr int VEC = CODES_PER_LOAD;
    constexpr int LANES = HEAD_DIM / VEC;            // 8 lanes a token for HEAD_DIM 64, 16 for 128
    constexpr int GROUPS = NUM_THREADS / LANES;
    constexpr int GROUPS_PER_WARP = WARP_SIZE / LANES;
    const int kv_head = blockIdx.x, seq = blockIdx.y, end = context_lens[seq];
    const int warp = threadIdx.x / WARP_SIZE;
    const int group = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const long long first_row = ((long long)seq * num_kv_heads + kv_head) * Q_PER_KV;  // 1st head
    const int* block_table = block_tables + seq * max_blocks;
    const PagedRows<signed char, HEAD_DIM> keys{k_cache, block_table, block_size, num_kv_heads, kv_head};
    const PagedRows<signed char, HEAD_DIM> values{v_cache, block_table, block_size, num_kv_heads, kv_head};

    float q_vec[Q_PER_KV][VEC], m[Q_PER_KV], l[Q_PER_KV], acc[Q_PER_KV][VEC] = {};
#pragma unroll
    for (int g = 0; g < Q_PER_KV; g++) {
        for (int i = 0; i < VEC; i++)
            q_vec[g][i] = to_float(q[(first_row + g) * HEAD_DIM + lane * VEC + i]) * scale;
        m[g] = NEG_BIG;
        l[g] = 0.0f;
    }
    for (int first = warp * GROUPS_PER_WARP; first < end; first += GROUPS) {     // per warp
        const int t = first + group % GROUPS_PER_WARP;
        float k_vec[VEC], v_vec[VEC], k_scale = 0.0f;
        if (t < end) {
            const long long slot = (long long)block_table[t / block_size] * block_size + t % block_size;
            k_scale = to_float(k_scales[slot * num_kv_heads + kv_head]);
            load_codes(keys[t] + lane * VEC, 1.0f, k_vec);         // K's scale comes after the dot
            load_codes(values[t] + lane * VEC, to_float(v_scales[slot * num_kv_heads + kv_head]), v_vec);
        }
#pragma unroll
        for (int g = 0; g < Q_PER_KV; g++) {
            const float dot_codes = butterfly<1, LANES>(t < end ? dot(q_vec[g], k_vec) : 0.0f, Sum());
            if (t < end) online_update(m[g], l[g], acc[g], k_scale * dot_codes, v_vec);
        }
    }
#pragma unroll
    for (int g = 0; g < Q_PER_KV; g++) {
        merge_groups_in_warp<LANES>(m[g], l[g], acc[g]);
        merge_warps_and_store<HEAD_DIM, LANES>(m[g], l[g], acc[g], out + (first_row + g) * HEAD_DIM);
    }
}

// ================================================================================================
// write_kv_int8: write_kv (cuda/cache_ops.cu) for v7's 8-bit cache: each new token's K and V rows
// are coded on their way into their slot, bit for bit as minipaged/attention/reference.py's
// write_coded codes them, so a GPU run and a CPU run store the same bytes:
//     scale = min(max|x| / 127, 65504), rounded to fp16;  code = x / scale rounded to nearest even,
//     in -127..127
// (the division is by the fp16 scale read back as a float, and a scale of 0, a row of zeros, codes
// 0). 65504 is fp16's largest finite value: a row beyond 127 * 65504 (about 8.3e6) keeps a finite
// scale and its largest codes saturate at +-127, where an infinite scale would code them 0, and 0
// times infinity decodes to NaN. A row's codes depend on that row alone: a token written in a
// prefill, a decode step or after a preemption gets the same codes. One block per new token (-1 in
// slot_mapping: nothing is written); its 4 warps take the 2 * num_kv_heads rows (K of every KV
// head, then V), a warp per row, lane i holding elements i, i + 32, ...: the row's max is a
// butterfly, then each lane codes its own elements. Cost: one pass over the row in registers,
// nothing in shared memory.
constexpr float CODE_MAX = 127.0f;                   // the largest int8 code used (-128 never is)
constexpr float HALF_MAX = 65504.0f;                 // the largest finite fp16: the largest scale

template <typename T, int HEAD_DIM>
__device__ void code_row(const T* x, signed char* codes, __half* scale) {
    constexpr int PER_LANE = HEAD_DIM / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    float values[PER_LANE], largest = 0.0f;
    for (int i = 0; i < PER_LANE; i++) {
        values[i] = to_float(x[lane + i * WARP_SIZE]);
        largest = fmaxf(largest, fabsf(values[i]));
    }
    largest = butterfly<1, WARP_SIZE>(largest, Max());
    const __half row_scale = __float2half(fminf(largest / CODE_MAX, HALF_MAX));
    const float step = to_float(row_scale) > 0.0f ? to_float(row_scale) : 1.0f;
    for (int i = 0; i < PER_LANE; i++) {       // IEEE division (CuPy does not pass -use_fast_math)
        const float code = fminf(fmaxf(values[i] / step, -CODE_MAX), CODE_MAX);
        codes[lane + i * WARP_SIZE] = (signed char)rintf(code);   // rintf: half to even, as np.rint
    }
    if (lane == 0) *scale = row_scale;
}

template <typename T, int HEAD_DIM>
__global__ void write_kv_int8(
    signed char* __restrict__ k_cache,     // [num_blocks, block_size, num_kv_heads, HEAD_DIM]
    signed char* __restrict__ v_cache,
    __half* __restrict__ k_scales,         // [num_blocks, block_size, num_kv_heads]
    __half* __restrict__ v_scales,
    const T* __restrict__ k,               // [num_tokens, num_kv_heads, HEAD_DIM]
    const T* __restrict__ v,
    const int* __restrict__ slot_mapping,  // [num_tokens]
    int num_kv_heads) {
    const long long token = blockIdx.x, slot = slot_mapping[token];
    if (slot < 0) return;                                      // a padding token: the block leaves
    for (int r = threadIdx.x / WARP_SIZE; r < 2 * num_kv_heads; r += NUM_WARPS) {  // per warp
        const bool is_v = r >= num_kv_heads;
        const int kv_head = r % num_kv_heads;
        const long long src = token * num_kv_heads + kv_head, dst = slot * num_kv_heads + kv_head;
        code_row<T, HEAD_DIM>((is_v ? v : k) + src * HEAD_DIM,
                              (is_v ? v_cache : k_cache) + dst * HEAD_DIM,
                              (is_v ? v_scales : k_scales) + dst);
    }
}

// ================================================================================================
// Prefill: many query tokens per sequence (a prompt, the rest of a prompt after a prefix-cache
// hit, or one chunk of a long prompt under enable_chunked_prefill: any suffix of the context so
// far). Sequence i's queries are rows query_start_loc[i] .. query_start_loc[i+1] of q: the last
// query_len of its context_len tokens, whose K/V are already in the cache. The query at position
// pos sees the keys at positions 0..pos (causal).
// A block takes PREFILL_ROWS query rows of one sequence, a row being one query token for one query
// head of a GQA group, so the heads of a group share the loads. It walks the keys those rows need
// in tiles of KEY_TILE tokens staged in shared memory (K/V come from global memory once per block,
// and keys after the block's last query are never read). The 8 lanes of a row hold dims lane,
// lane + 8, ...: they read a key row from shared memory without bank conflicts. Each row keeps a
// softmax state (online_update); nothing of size query_len x context_len is ever stored.
constexpr int PREFILL_LANES = 8;                             // lanes per query row
constexpr int PREFILL_ROWS = NUM_THREADS / PREFILL_LANES;    // 16 query rows per block
constexpr int KEY_TILE = 32;                                 // keys per tile in shared memory

// What prefill reads K/V through: a full-precision cache's rows (PagedRows), or an 8-bit cache's
// codes with their scales (CodedRows, kv_cache_dtype="int8"). load_kv turns 16 bytes of a row into
// floats either way; the codes are decoded in registers, as in v7, so only 8-bit codes cross the
// memory bus, and everything after load_tile (shared memory, the softmax) is the same code.
// (PagedRows stays as it is: lab 5 swaps in a participant's struct of the same declaration.)
template <int HEAD_DIM>
struct CodedRows {
    PagedRows<signed char, HEAD_DIM> codes;
    const __half* scales;        // [num_blocks, block_size, num_kv_heads], one per row of codes
};

// Values in one 16-byte load of a row: 4 floats or 8 halves (PagedRows), 16 codes (CodedRows).
template <typename Rows> struct PerLoad;
template <typename T, int HEAD_DIM> struct PerLoad<PagedRows<T, HEAD_DIM>> {
    static constexpr int SIZE = Packed16<T>::SIZE;
};
template <int HEAD_DIM> struct PerLoad<CodedRows<HEAD_DIM>> {
    static constexpr int SIZE = Packed16<signed char>::SIZE;
};

template <typename T, int HEAD_DIM>
__device__ __forceinline__ void load_kv(PagedRows<T, HEAD_DIM> rows, int pos, int d, float* dst) {
    unpack(load16(rows[pos] + d), dst);
}

template <int HEAD_DIM>
__device__ __forceinline__ void load_kv(CodedRows<HEAD_DIM> rows, int pos, int d, float* dst) {
    const PagedRows<signed char, HEAD_DIM>& codes = rows.codes;
    const long long slot = (long long)codes.block_table[pos / codes.block_size] * codes.block_size +
                           pos % codes.block_size;
    const float scale = to_float(rows.scales[slot * codes.num_kv_heads + codes.kv_head]);
    unpack(load16(codes[pos] + d), dst);
    for (int i = 0; i < PerLoad<CodedRows<HEAD_DIM>>::SIZE; i++) dst[i] *= scale;
}

// Stage the K and V rows of positions first .. first + count - 1 in shared memory, as floats.
template <typename Rows, int HEAD_DIM>
__device__ void load_tile(Rows rows, int first, int count, float (*tile)[HEAD_DIM]) {
    constexpr int VEC = PerLoad<Rows>::SIZE, PER_ROW = HEAD_DIM / VEC;
    for (int e = threadIdx.x; e < count * PER_ROW; e += NUM_THREADS) {
        const int j = e / PER_ROW, d = e % PER_ROW * VEC;
        load_kv(rows, first + j, d, &tile[j][d]);
    }
}

// The work of one prefill block, whatever the cache holds: keys and values are the sequence's
// rows for KV head blockIdx.y (sequence blockIdx.z), a PagedRows or a CodedRows.
template <int HEAD_DIM, typename T, typename Rows>
__device__ void prefill_block(T* out, const T* q, Rows keys, Rows values,
                              const int* context_lens, const int* query_start_loc,
                              int num_kv_heads, int q_per_kv, float scale) {
    constexpr int DIMS = HEAD_DIM / PREFILL_LANES;           // dims per lane
    const int kv_head = blockIdx.y, seq = blockIdx.z;
    const int query_start = query_start_loc[seq];
    const int query_len = query_start_loc[seq + 1] - query_start;
    const int context_len = context_lens[seq];
    const int num_rows = query_len * q_per_kv;   // row r: query r / q_per_kv, head r % q_per_kv
    const int first_row = blockIdx.x * PREFILL_ROWS;
    if (first_row >= num_rows) return;           // a shorter sequence: the whole block leaves
    const int lane = threadIdx.x % PREFILL_LANES;
    const int my_row = first_row + threadIdx.x / PREFILL_LANES;
    const int row = min(my_row, num_rows - 1);   // past the end: a spare copy of the last row
    const int pos = context_len - query_len + row / q_per_kv;             // sees keys 0..pos
    const int last_row = min(first_row + PREFILL_ROWS, num_rows) - 1;
    const int last_pos = context_len - query_len + last_row / q_per_kv;   // block needs 0..last_pos
    const long long out_row = (long long)(query_start + row / q_per_kv) * num_kv_heads * q_per_kv +
                              kv_head * q_per_kv + row % q_per_kv;

    float q_vec[DIMS], acc[DIMS] = {}, m = NEG_BIG, l = 0.0f;
    for (int i = 0; i < DIMS; i++)
        q_vec[i] = to_float(q[out_row * HEAD_DIM + lane + i * PREFILL_LANES]) * scale;
    __shared__ float k_tile[KEY_TILE][HEAD_DIM], v_tile[KEY_TILE][HEAD_DIM];
    for (int first = 0; first <= last_pos; first += KEY_TILE) {
        const int count = min(KEY_TILE, last_pos + 1 - first);
        __syncthreads();                                     // everyone is done with the last tile
        load_tile(keys, first, count, k_tile);
        load_tile(values, first, count, v_tile);
        __syncthreads();
        for (int j = 0; j < count; j++) {
            float partial = 0.0f, v_vec[DIMS];
            for (int i = 0; i < DIMS; i++) {
                partial += q_vec[i] * k_tile[j][lane + i * PREFILL_LANES];
                v_vec[i] = v_tile[j][lane + i * PREFILL_LANES];
            }
            const float logit = butterfly<1, PREFILL_LANES>(partial, Sum());
            if (first + j <= pos) online_update(m, l, acc, logit, v_vec);
        }
    }
    if (my_row < num_rows)
        for (int i = 0; i < DIMS; i++)
            store(out + out_row * HEAD_DIM + lane + i * PREFILL_LANES, acc[i] / l);
}

template <typename T, int HEAD_DIM>
__global__ void paged_prefill(
    T* __restrict__ out,                   // [num_tokens, num_heads, HEAD_DIM]
    const T* __restrict__ q,               // [num_tokens, num_heads, HEAD_DIM]
    const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ context_lens,
    const int* __restrict__ query_start_loc,   // [num_seqs + 1]
    int max_blocks, int block_size, int num_kv_heads, int q_per_kv, float scale) {
    const int kv_head = blockIdx.y, seq = blockIdx.z;
    const int* block_table = block_tables + seq * max_blocks;
    const PagedRows<T, HEAD_DIM> keys{k_cache, block_table, block_size, num_kv_heads, kv_head};
    const PagedRows<T, HEAD_DIM> values{v_cache, block_table, block_size, num_kv_heads, kv_head};
    prefill_block<HEAD_DIM>(out, q, keys, values, context_lens, query_start_loc, num_kv_heads,
                            q_per_kv, scale);
}

// paged_prefill over v7's 8-bit cache: int8 codes, and k_scales, v_scales [num_blocks, block_size,
// num_kv_heads] __half, found through the same block table entry as the codes.
template <typename T, int HEAD_DIM>
__global__ void paged_prefill_int8(
    T* __restrict__ out, const T* __restrict__ q,
    const signed char* __restrict__ k_cache, const signed char* __restrict__ v_cache,
    const __half* __restrict__ k_scales, const __half* __restrict__ v_scales,
    const int* __restrict__ block_tables, const int* __restrict__ context_lens,
    const int* __restrict__ query_start_loc, int max_blocks, int block_size, int num_kv_heads,
    int q_per_kv, float scale) {
    const int kv_head = blockIdx.y, seq = blockIdx.z;
    const int* block_table = block_tables + seq * max_blocks;
    const CodedRows<HEAD_DIM> keys{{k_cache, block_table, block_size, num_kv_heads, kv_head},
                                   k_scales};
    const CodedRows<HEAD_DIM> values{{v_cache, block_table, block_size, num_kv_heads, kv_head},
                                     v_scales};
    prefill_block<HEAD_DIM>(out, q, keys, values, context_lens, query_start_loc, num_kv_heads,
                            q_per_kv, scale);
}
