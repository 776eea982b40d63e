"""The state engine: KV caches (dense now; paging, prefix tree, fork, snapshots next)."""

from llamay.kv.dense import DenseKV, bucket, cache_slots, new_dense_kv

__all__ = ["DenseKV", "bucket", "cache_slots", "new_dense_kv"]
