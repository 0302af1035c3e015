"""The prefix cache's disk tier: full KV blocks kept across restarts, keyed by their chain hash
salted with what makes KV reusable (`identity.py`), one checked file each (`block_file.py`), in a
folder per model locked by its engine (`lock.py`), with a byte budget and LRU eviction, written by
a background thread (`store.py`); `tier.py` joins it to a runner's pool for the block manager and
`folders.py` shows and clears the whole root. Torch-free.
"""
