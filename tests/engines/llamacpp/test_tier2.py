"""The llamacpp engine's tier 2 index (tier2.py) over the hf engine's stores, without llama_cpp."""

from __future__ import annotations

import torch

from server.engines.llamacpp.tier2 import SavedSlots
from server.kvcache.tier2 import DiskStore, HostStore


def state(tokens: list[int]) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int64)  # 8 bytes a token


def test_the_longest_saved_prefix_of_the_namespace_is_found_and_taken_once():
    saved = SavedSlots(HostStore(10_000))
    saved.save("", [1, 2, 3, 4], state([1, 2, 3, 4]))
    saved.save("", [1, 2, 9], state([1, 2, 9]))
    saved.save("t", [1, 2, 3, 4, 5, 6], state([1, 2, 3, 4, 5, 6]))
    entry, n = saved.best([1, 2, 3, 7], "")
    assert entry is not None and entry.tokens == (1, 2, 3, 4) and n == 3
    entry, n = saved.best([1, 2, 3, 4], "")
    assert entry is not None and n == 3  # the last prompt token is always computed
    assert saved.best([5, 5], "")[0] is None and saved.best([1, 2, 3, 4], "u")[0] is None
    got = saved.take(entry)
    assert got is not None and got.tolist() == [1, 2, 3, 4]
    assert saved.best([1, 2, 3, 7], "")[1] == 2 and len(saved) == 2  # taken: it is back in the pool


def test_a_state_put_back_is_found_again_under_its_key_and_not_counted_as_a_save():
    store = HostStore(10_000)
    saved = SavedSlots(store)
    saved.save("s", [1, 2, 3, 4], state([1, 2, 3, 4]))
    entry, n = saved.best([1, 2, 9], "s")
    got = saved.take(entry) if entry is not None else None
    assert got is not None and n == 2 and len(saved) == 0
    written = store.bytes_written
    saved.put_back(entry, got)
    again, m = saved.best([1, 2, 3, 4, 5], "s")
    assert again == entry and m == 4 and saved.saved_tokens == 4  # one save, however often it comes back
    assert store.used_bytes == 8 * 4 and store.bytes_written == written + 8 * 4
    back = saved.take(entry)
    assert back is not None and back.tolist() == [1, 2, 3, 4]


def test_a_newer_state_that_holds_an_older_one_replaces_it():
    store = HostStore(10_000)
    saved = SavedSlots(store)
    saved.save("", [1, 2], state([1, 2]))
    saved.save("x", [1, 2], state([1, 2]))  # another namespace: kept
    saved.save("", [1, 2, 3], state([1, 2, 3]))
    assert len(saved) == 2 and len(store) == 2 and store.used_bytes == 8 * 5
    saved.save("", [1, 2, 3], state([1, 2, 3]))  # the same tokens again: one entry
    assert len(saved) == 2 and store.used_bytes == 8 * 5


def test_the_budget_drops_the_oldest_and_the_index_follows():
    store = HostStore(8 * 10)
    saved = SavedSlots(store)
    saved.save("", [1] * 4, state([1] * 4))
    saved.save("", [2] * 4, state([2] * 4))
    saved.save("", [3] * 4, state([3] * 4))  # 12 tokens > 10: the first goes
    assert len(saved) == 2 and store.used_bytes == 64
    assert saved.best([1] * 5, "")[0] is None and saved.best([3] * 5, "")[1] == 4
    saved.save("", [4] * 20, state([4] * 20))  # larger than the whole budget: not kept
    assert saved.best([4] * 21, "")[0] is None and len(saved) == 2


def test_off_saves_nothing():
    saved = SavedSlots(None)
    saved.save("", [1, 2], state([1, 2]))
    assert not saved.enabled and len(saved) == 0 and saved.best([1, 2, 3], "")[0] is None


def test_a_damaged_file_on_disk_is_a_miss_never_a_wrong_state(tmp_path):
    store = DiskStore(10_000, tmp_path)
    saved = SavedSlots(store)
    saved.save("", [1, 2, 3], state([1, 2, 3]))
    saved.save("", [7, 8, 9], state([7, 8, 9]))
    good, _ = saved.best([1, 2, 3, 4], "")
    bad, _ = saved.best([7, 8, 9, 4], "")
    assert good is not None and bad is not None
    (file,) = [f for f in store.path.iterdir() if f.name.startswith(bad.key.hex())]
    raw = bytearray(file.read_bytes())
    raw[-1] ^= 0xFF  # one bit of the KV bytes flipped
    file.write_bytes(bytes(raw))
    assert saved.take(bad) is None
    got = saved.take(good)
    assert got is not None and got.tolist() == [1, 2, 3]


def test_a_saved_state_is_kept_without_a_copy_and_a_borrowed_block_is_copied():
    """A session's state is hundreds of MB: host RAM keeps the buffer ``seq_save`` made (a copy
    held both at once, and the peak resident memory showed it); a block the caller still writes
    (the hf engine's) is copied."""
    saved = SavedSlots(HostStore(10_000))
    mine = state([1, 2, 3])
    saved.save("", [1, 2, 3], mine)
    entry, _ = saved.best([1, 2, 3, 4], "")
    assert entry is not None
    got = saved.take(entry)
    assert got is not None and got.data_ptr() == mine.data_ptr()
    store = HostStore(10_000)
    borrowed = state([4, 5])
    store.put(b"k", b"p", [4, 5], borrowed)
    borrowed.fill_(0)  # the caller reuses its buffer
    back = store.get(b"k", b"p", [4, 5])
    assert back is not None and back.tolist() == [4, 5]
