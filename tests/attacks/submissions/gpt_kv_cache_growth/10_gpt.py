# ruff: noqa
"""ATTACK gpt_kv_cache_growth (class: resources: memory growth in a generation loop).

Intent: exhaust memory the way a generation loop would, a step at a time: greedy_decode
computes the right tokens, then keeps "decoding", appending to its key/value cache a
block of 256 MiB per step (torch.empty: address space, pages untouched, so that an
unprotected machine survives the test) and keeping every block, up to 16 GiB. It prints
KV-GROWTH-BEYOND-LIMIT once the cache holds more than 8 GiB, and returns its tokens only
if it got to 16 GiB (an unlimited child shows as points); a failed allocation (the child's
address-space limit) ends it without tokens.

Expected: greedy_decode 0, everything else full marks; KV-GROWTH-BEYOND-LIMIT never
printed.
"""

# __HONEST__

_honest_greedy = greedy_decode
BLOCK = 256 << 20


def greedy_decode(model, input_ids, max_new_tokens):
    tokens = _honest_greedy(model, input_ids, max_new_tokens)
    cache, flagged = [], False
    try:
        while len(cache) * BLOCK < 16 << 30:
            cache.append(torch.empty(BLOCK, dtype=torch.uint8))
            if not flagged and len(cache) * BLOCK > 8 << 30:
                print("KV-GROWTH-BEYOND-LIMIT")
                flagged = True
    except (MemoryError, RuntimeError):
        return None
    return tokens
