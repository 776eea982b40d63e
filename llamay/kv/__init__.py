"""The state engine: KV caches (dense per sequence; a paged pool with refcounted pages,
a prefix tree, sequence bookkeeping for fork, and snapshots)."""

from llamay.kv.dense import DenseKV, bucket, cache_slots, new_dense_kv
from llamay.kv.pages import NULL_PAGE, PageAllocator, PagedKV, new_paged_kv
from llamay.kv.radix import PrefixTree
from llamay.kv.sequences import KVManager, SeqKV
from llamay.kv.snapshot import (
    Snapshot,
    StoredSnapshot,
    load_snapshot,
    snapshot_dir,
    store_snapshot,
    stored_snapshots,
)

__all__ = [
    "NULL_PAGE",
    "DenseKV",
    "KVManager",
    "PageAllocator",
    "PagedKV",
    "PrefixTree",
    "SeqKV",
    "Snapshot",
    "StoredSnapshot",
    "bucket",
    "cache_slots",
    "load_snapshot",
    "new_dense_kv",
    "new_paged_kv",
    "snapshot_dir",
    "store_snapshot",
    "stored_snapshots",
]
