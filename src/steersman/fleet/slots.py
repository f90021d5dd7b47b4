"""A mirror of a llama.cpp replica's parallel slots: which prompt each holds, which are busy.

llama-server (``tools/server/server-context.cpp`` ``get_available_slot`` and ``server_prompt_cache::load``
in ``server-task.cpp``, llama.cpp vendored in llama-cpp-python 0.3.36) reuses a prompt only from a
**free** slot:

1. among the free slots holding a prompt, the one whose longest common prefix with the new prompt is
   the largest fraction of the new prompt, if that fraction is over ``--slot-prompt-similarity``
   (default 0.1);
2. else the least recently used free slot (ties: the last one);
3. when the slot chosen by LRU, or by similarity keeping under half of its old prompt, is reused, its old
   prompt is saved to the host prompt cache (``--cache-ram``, default 8 GiB) and the cached prompt that
   keeps the most of the new one (at least a quarter of the cached prompt) is loaded into it, leaving the
   cache;
4. with no free slot the request waits in the server's queue and takes a slot when one frees;
5. once a request has a slot, every idle slot's prompt is saved to the host prompt cache too
   (``--cache-idle-slots``, on by default; ``update_slots`` after ``launch_slot_with_task``), so a prompt
   that sat in an idle slot while another request started has a copy there that a later request can
   load even while its slot is busy.  The cache skips a prompt that is a prefix of one it holds and drops
   the prompts that are prefixes of the one it saves (``server_prompt_cache::alloc``).

So while a request runs, the copy of its prompt in its slot serves nobody; when it ends, one follower can
reuse it, and a second follower sent together gets another slot and computes the prompt again (measured,
``tests/real/test_llamacpp_slot_reuse.py``).  The gateway mirrors this per replica from what it routes
(:class:`SlotMirror`): the prefix index asks it what a prompt would reuse there now, and the scheduler
asks which running request will leave a prompt in a slot, and when (``in_flight``).  Prompts are chained
block hashes, so two prompts share the leading blocks up to their first difference, and none unless their
first blocks are equal: the host cache is kept grouped by first block, so saving a prompt or finding one to
load looks only at the prompts that begin like it (a list of every saved prompt, up to ``SAVED_PROMPTS``,
scanned two or three times a routed request, cost ~1 ms of Python a request once it was full).  Pure:
``now`` comes from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["SlotMirror", "PromptInFlight", "common_blocks", "SAVED_PROMPTS"]

#: prompts the mirror remembers as saved in llama-server's host prompt cache (the engine's own bound is
#: 8 GiB of state, thousands of short prompts; the oldest are forgotten first, as llama.cpp's cache does)
SAVED_PROMPTS = 256
_NONE: tuple[int, ...] = ()


def common_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    """Leading blocks two prompts share (chained hashes: equal at k means equal before k; binary search)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class PromptInFlight:
    """A running request whose slot will hold a prompt sharing ``blocks`` leading blocks with the asking one."""

    blocks: int
    due: float  # when its request is predicted to end (the slot frees then)
    since: float  # when it was dispatched (how far past ``due`` it may run is judged from this)


class _Slot:
    __slots__ = ("prompt", "key", "used", "due", "since", "decode_s", "saved")

    def __init__(self) -> None:
        self.prompt: tuple[int, ...] = _NONE
        self.saved = False  # its prompt is known to be in the host prompt cache (saving it again changes nothing)
        self.key = 0  # the ticket running in it (0: free)
        self.used = -math.inf
        self.due = math.inf
        self.since = 0.0
        self.decode_s = math.nan  # predicted seconds from its first token to its end


class SlotMirror:
    """The slots of one llama.cpp replica as the gateway routed to them (see the module doc)."""

    def __init__(self, n: int, block_size: int, similarity: float = 0.1,
                 on_change: Callable[[], None] | None = None) -> None:
        self.block_size = block_size
        self.similarity = similarity
        self.on_change = on_change  # the prefix index's memo goes stale when a slot changes
        self._slots = [_Slot() for _ in range(max(1, n))]
        self._where: dict[int, _Slot] = {}  # ticket key -> its slot
        self._queued: dict[int, tuple[tuple[int, ...], int, float, float]] = {}  # key -> waiting for a slot
        # host prompt cache: id -> prompt, oldest first, and the same grouped by first block (oldest first)
        self._saved: dict[int, tuple[int, ...]] = {}
        self._by_first: dict[int, dict[int, tuple[int, ...]]] = {}
        self._next_id = 0
        # the last :meth:`match`'s prompt (the object) and its choice, until the next change: the decision's
        # match and the dispatch's take of one request ask the same question of the same state
        self._chose: tuple[object, int, tuple] | None = None

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def saved(self) -> list[tuple[int, ...]]:
        """The prompts the host prompt cache holds, oldest first."""
        return list(self._saved.values())

    # ---- what a new prompt would reuse ----------------------------------------------------
    def _choose(self, hashes: Sequence[int], tokens: int) -> tuple[_Slot | None, int, bool, int | None]:
        """(the slot llama-server would give the prompt now, blocks it would reuse, whether the slot's old
        prompt goes to the host prompt cache, id of the saved prompt it would load or None);
        (None, 0, False, None) when every slot is busy."""
        bs = self.block_size
        best: _Slot | None = None
        sim_best = 0.0
        lcp_best = 0
        for s in self._slots:
            if s.key or not s.prompt:
                continue
            lcp = common_blocks(s.prompt, hashes)
            sim = lcp * bs / tokens if tokens > 0 else 0.0
            if sim > sim_best and sim > self.similarity:
                best, sim_best, lcp_best = s, sim, lcp
        save = False
        if best is not None:
            save = lcp_best / len(best.prompt) < 0.5
        else:
            for s in self._slots:
                if not s.key and (best is None or s.used <= best.used):
                    best = s
            if best is None:
                return None, 0, False, None
            lcp_best = common_blocks(best.prompt, hashes)
            save = True
        load = self._find(hashes, best.prompt) if save and self._saved else None
        if load is not None:
            lcp_best = common_blocks(self._saved[load], hashes)
        return best, lcp_best, save, load

    def match(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica would reuse if the prompt were sent now (0: no free slot).
        Similarity is judged on the prompt's whole blocks (its last partial block is not hashed)."""
        got = self._choose(hashes, len(hashes) * self.block_size)
        self._chose = (hashes, len(hashes), got)
        return got[1]

    def in_flight(self, hashes: Sequence[int]) -> list[PromptInFlight]:
        """Busy slots whose prompt shares leading blocks with ``hashes``, with when each frees."""
        out = []
        for s in self._slots:
            if s.key and s.prompt:
                n = common_blocks(s.prompt, hashes)
                if n:
                    out.append(PromptInFlight(n, s.due, s.since))
        return out

    # ---- what the gateway routes -------------------------------------------------------------
    def take(self, key: int, hashes: Sequence[int], now: float, due: float = math.inf,
             decode_s: float = math.nan) -> int:
        """Request ``key`` (prompt ``hashes``) reaches the engine now: it takes the slot llama-server would
        give it (or waits for one).  Returns the blocks it reuses."""
        tokens = len(hashes) * self.block_size
        last = self._chose
        if last is not None and last[0] is hashes and last[1] == len(hashes):
            slot, blocks, save, load = last[2]  # what the decision's match chose: nothing changed since
        else:
            slot, blocks, save, load = self._choose(hashes, tokens)
        if slot is None:
            self._queued[key] = (tuple(hashes), tokens, due, decode_s)
            return 0
        self._occupy(slot, key, tuple(hashes), save, load, now, due, decode_s)
        return blocks

    def _occupy(self, slot: _Slot, key: int, prompt: tuple[int, ...], save: bool, load: int | None, now: float,
                due: float, decode_s: float) -> None:
        if save and slot.prompt:
            self._save(slot.prompt)
            if load is not None:  # the save may have dropped prompts before it: find the one to load again
                load = self._find(prompt, slot.prompt)
        if load is not None:
            self._drop(load)  # loaded into the slot: it leaves the host cache
            self._unsaved()
        slot.prompt, slot.key, slot.used, slot.due, slot.since, slot.decode_s = prompt, key, now, due, now, decode_s
        slot.saved = False
        self._where[key] = slot
        for s in self._slots:  # --cache-idle-slots: the idle slots' prompts go to the host cache
            if not s.key and s.prompt and not s.saved:
                self._save(s.prompt)
                s.saved = True
        self._changed()

    def _save(self, prompt: tuple[int, ...]) -> None:
        """``server_prompt_cache::alloc``: skip a prompt the cache holds whole, drop the cached prefixes of it.
        Both can only be prompts beginning with the same block."""
        n = len(prompt)
        group = self._by_first.get(prompt[0])
        if group:
            if any(len(p) >= n and common_blocks(p, prompt) == n for p in group.values()):
                return
            prefixes = [k for k, p in group.items() if len(p) <= n and common_blocks(p, prompt) == len(p)]
            if prefixes:
                for k in prefixes:
                    self._drop(k)
                self._unsaved()
        k = self._next_id
        self._next_id += 1
        self._saved[k] = prompt
        self._by_first.setdefault(prompt[0], {})[k] = prompt
        if len(self._saved) > SAVED_PROMPTS:
            self._drop(next(iter(self._saved)))
            self._unsaved()

    def _drop(self, k: int) -> None:
        prompt = self._saved.pop(k)
        group = self._by_first[prompt[0]]
        del group[k]
        if not group:
            del self._by_first[prompt[0]]

    def _unsaved(self) -> None:
        """A prompt left the host cache: the idle slots may have to save theirs again."""
        for s in self._slots:
            s.saved = False

    def _find(self, hashes: Sequence[int], own: tuple[int, ...]) -> int | None:
        """Id of the saved prompt ``server_prompt_cache::load`` would load for ``hashes`` into a slot holding
        ``own`` (None: it keeps its own).  Only a prompt sharing its first block can keep any of it; among
        equals the oldest wins, as the engine scans its cache oldest first."""
        lcp_own = common_blocks(own, hashes)
        keep = lcp_own / len(own) if own else -1.0
        got, load = lcp_own, None
        group = self._by_first.get(hashes[0]) if hashes else None
        if group:
            for k, p in group.items():
                lcp = common_blocks(p, hashes)
                f_keep = lcp / len(p)
                if f_keep >= 0.25 and f_keep > keep and lcp > got:
                    keep, got, load = f_keep, lcp, k
        return load

    def first_token(self, key: int, now: float) -> None:
        """Its first token came: its end is re-predicted from now (a prefill slower than predicted delays it)."""
        s = self._where.get(key)
        if s is not None and s.decode_s == s.decode_s:
            s.due = now + s.decode_s

    def release(self, key: int, ran: bool, now: float) -> None:
        """Request ``key`` ended.  ``ran``: its prompt was computed (it had a first token), so its slot holds
        it; else the slot is credited with nothing (an under-credit: llama-server finishes the batch under way
        after a cancel, up to ``-b`` tokens of the prompt, and a request that never reached it left the old prompt).
        A queued request takes the slot."""
        if self._queued.pop(key, None) is not None:
            return
        s = self._where.pop(key, None)
        if s is None:
            return
        s.key, s.used, s.due = 0, now, math.inf
        if not ran:
            s.prompt = _NONE
        self._changed()
        if self._queued:
            k = next(iter(self._queued))
            hashes, tokens, due, decode_s = self._queued.pop(k)
            slot, _, save, load = self._choose(hashes, tokens)
            if slot is not None:
                self._occupy(slot, k, hashes, save, load, now, due, decode_s)

    def resize(self, n: int) -> None:
        """The engine reports ``n`` slots (``/slots``); the mirror had another count."""
        n = max(1, n)
        if n == len(self._slots):
            return
        if n > len(self._slots):
            self._slots += [_Slot() for _ in range(n - len(self._slots))]
        else:
            keep = sorted(self._slots, key=lambda s: (s.key == 0, -s.used))[:n]
            for s in self._slots:
                if s not in keep and s.key:
                    self._where.pop(s.key, None)
            self._slots = keep
        self._changed()

    def clear(self) -> None:
        """The engine restarted: its slots and prompt cache are empty (requests in flight are lost with it)."""
        for s in self._slots:
            s.prompt, s.saved = _NONE, False
        self._saved.clear()
        self._by_first.clear()
        self._changed()

    def _changed(self) -> None:
        self._chose = None  # every change ends here: a later take chooses afresh
        if self.on_change is not None:
            self.on_change()
