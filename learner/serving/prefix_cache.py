"""Which token prefixes have their KV kept between requests, and where: host bookkeeping.

The engine keeps one device pool of ``capacity`` KV slots (one slot = one token's
keys and values in every layer, SGLang's ``token_to_kv_pool``). A cached sequence
is an :class:`Entry`: its token ids and the pool slot of each token. A new request
matches the entry with the longest common prefix (any entry, not only one that is
a whole prefix of it), so both reuse patterns hit:

- a multi-turn episode: turn k+1's ``input_ids`` start with turn k's input and
  output, which turn k's entry holds;
- a GRPO group: siblings share the prompt, which every sibling's entry starts with.

Entries share slots where their tokens agree (a refcount per slot): an entry
inserted on top of a match references the matched entry's slots for the common
prefix and owns new slots only for the rest, so a group's prompt, or an episode's
earlier turns, are stored once. An entry that is a whole prefix of a newer one is
dropped (the newer one answers every match it would). Eviction is LRU by entry;
an entry's slots return to the free list when nothing references them. Readers
pin the slots they will read (:meth:`acquire`) and release them afterwards, so
eviction in between never hands those slots to someone else.

Matching is a linear scan with numpy over the entries (a radix tree would be
O(length)); the entry count stays small because covered prefixes are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NO_SLOTS = np.zeros(0, np.int32)


@dataclass
class Entry:
    tokens: np.ndarray  # (n,) int32
    slots: np.ndarray  # (n,) int32: the pool slot holding each token's KV


class PrefixCache:
    """Cached token sequences over a pool of ``capacity`` KV slots, LRU-evicted."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.refs = np.zeros(capacity, np.int32)  # entries and pins holding each slot
        self.free: list[int] = list(range(capacity - 1, -1, -1))  # a stack: low slots first
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._next_key = 0

    # ------------------------------------------------------------------------- reading

    def _best(self, tokens: np.ndarray) -> tuple[int, int | None]:
        """(length, key) of the entry sharing the longest prefix with ``tokens``."""
        best, best_key = 0, None
        for key, e in self.entries.items():
            n = min(len(e.tokens), len(tokens))
            if n <= best:
                continue
            differ = np.flatnonzero(e.tokens[:n] != tokens[:n])
            common = int(differ[0]) if len(differ) else n
            if common > best:
                best, best_key = common, key
        return best, best_key

    def acquire(self, tokens: Sequence[int]) -> np.ndarray:
        """The slots of the longest cached prefix of ``tokens`` (possibly none), pinned
        until :meth:`release`; the entry they come from becomes most recently used."""
        best, key = self._best(np.asarray(tokens, np.int32))
        if key is None:
            return NO_SLOTS
        self.entries.move_to_end(key)
        slots = self.entries[key].slots[:best].copy()
        self.refs[slots] += 1
        return slots

    def release(self, slots: np.ndarray) -> None:
        """Drop one pin (or entry reference) on each of ``slots``."""
        if len(slots) == 0:
            return
        self.refs[slots] -= 1
        unused = slots[self.refs[slots] == 0]
        self.free.extend(int(s) for s in unused[::-1])

    # ------------------------------------------------------------------------- writing

    def insert(self, tokens: Sequence[int]) -> tuple[int, np.ndarray] | None:
        """Cache ``tokens``: (start, slots) where the caller must write the KV of
        ``tokens[start:]``, each slot pinned until :meth:`release` (so the writes of one
        batch never collide); None when nothing is to be written (already cached, or it
        does not fit). The common prefix with the best entry reuses that entry's slots."""
        toks = np.asarray(tokens, np.int32)
        best, key = self._best(toks)
        if key is not None:
            self.entries.move_to_end(key)
        if best == len(toks):  # already cached
            return None
        prefix = self.entries[key].slots[:best].copy() if key is not None else NO_SLOTS
        self.refs[prefix] += 1  # held by the new entry; keeps eviction from freeing them
        need = len(toks) - best
        while len(self.free) < need and self.entries:
            self._evict_oldest()
        if len(self.free) < need:
            self.release(prefix)
            return None
        new = np.array([self.free.pop() for _ in range(need)], np.int32)
        self.refs[new] += 2  # the entry's reference and the writer's pin
        if key is not None and key in self.entries and len(self.entries[key].tokens) == best:
            self._drop(key)  # a whole prefix of the new entry: it answers no match better
        self.entries[self._next_key] = Entry(toks, np.concatenate([prefix, new]))
        self._next_key += 1
        return best, new

    def _evict_oldest(self) -> None:
        self._drop(next(iter(self.entries)))

    def _drop(self, key: int) -> None:
        self.release(self.entries.pop(key).slots)

    # ------------------------------------------------------------------------- stats

    @property
    def cached_tokens(self) -> int:
        """Slots in use (entries and pins)."""
        return self.capacity - len(self.free)
