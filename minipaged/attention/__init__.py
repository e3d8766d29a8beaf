"""Paged attention: attention that reads K/V from scattered frames through a block table.

One contract, three implementations (`reference` NumPy, `cuda` RawModule, `emulated` CPU):

    write_kv(k, v, k_cache, v_cache, slot_mapping)            # in place
        k, v: (num_tokens, num_kv_heads, head_dim); slot_mapping: int32 (num_tokens,),
        slot = frame * block_size + offset, -1 = skip this token
        k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim), one layer
    decode(q, k_cache, v_cache, block_tables, context_lens, scale) -> out
        q: (num_seqs, num_heads, head_dim), one query token per sequence (the last one)
        block_tables: int32 (num_seqs, max_blocks_per_seq), padded with -1
        context_lens: int32 (num_seqs,), tokens in the cache for each sequence (new one included)
        out: (num_seqs, num_heads, head_dim)
    prefill(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale) -> out
        q: (num_tokens, num_heads, head_dim); sequence i owns rows
        query_start_loc[i]:query_start_loc[i+1], its last query_len tokens of context_lens[i];
        causal: a query at position p sees keys at positions 0..p
    copy_blocks(k_cache, v_cache, pairs)                       # in place, pairs: (src, dst) frames
"""
