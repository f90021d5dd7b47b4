"""The prefix index's size: its table grown, generations rotated and dropped, the byte budget kept (a mixin of
:class:`steersman.fleet.prefix_index.PrefixIndex`, kept apart so each module stays small; its state lives there)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from steersman.fleet import _prefix_table as T

__all__ = ["Generations"]


def _geometry(slots: int) -> tuple[np.uint64, int]:
    """(shift, mask) of a table of ``slots`` (a power of two): its Fibonacci hash keeps the top bits."""
    return np.uint64(64 - (slots.bit_length() - 1)), slots - 1


class Generations:
    """Growing, rotating and trimming the table (the state lives in ``PrefixIndex``)."""

    def _bytes(self) -> float:
        return self._fixed + self._tab.nbytes + self._setbits.nbytes + self._set_bytes

    def _grow(self, need: int) -> bool:
        """Double the table until ``need`` more keys keep it at most half full (up to the largest size).
        True: the rehash runs in the background (the caller stops; the new table comes when it is done)."""
        slots = self._tab.shape[0]
        want = slots
        while 2 * (self._entries + need) > want and want < self._max_slots:
            want *= 2
        if want == slots:
            return False
        old = self._tab
        tab = np.empty((want, 2), dtype=np.int64)  # untouched memory: the pass fills it
        shift, mask = _geometry(want)

        def done(_) -> None:
            self._tab, self._shift, self._mask = tab, shift, mask

        if self._pool is None or slots < self._background_from:
            T.rehash(tab, old, shift, mask)
            done(None)
            return False
        # the pass reads the old table only: the loop may read it meanwhile
        self._start(lambda flags: T.rehash_flagged(tab, old, shift, mask, flags), done, readable=True)
        return True

    def _rotate(self) -> bool:
        """Start a new generation, dropping the oldest first when all are in use.  True: that drop runs in
        the background (the new generation starts when it is done)."""
        if not self._free and self._drop(then=self._new_generation):
            return True
        self._new_generation()
        return False

    def _make_room(self) -> bool:
        """The largest table is half full (the generations outgrew it: ``gen_cap`` set over the budget's): drop the
        oldest generation, or start a new one to drop the newest next.  True: the drop runs in the background."""
        if len(self._order) == 1:
            self._new_generation()
            return False
        return self._drop()

    def _new_generation(self) -> None:
        self._order.append(self._free.pop())
        self._inserts = 0

    def _drop(self, then: Callable[[], None] | None = None) -> bool:
        """Drop the oldest generation (then ``then()``).  True: in the background (``then`` runs when done)."""
        g = self._order.pop(0)
        self._total -= self._counts[g]  # the blocks leave the counts now; the table when the pass is done
        self._counts[g] = 0
        used = np.zeros(len(self._set_mask), dtype=np.bool_)

        def done(dropped) -> None:
            self._entries -= int(dropped)
            self._free.append(g)
            self._collect_sets(used)

        if self._pool is None or self._tab.shape[0] < self._background_from:  # inline: the caller goes on itself
            done(T.drop_generation(self._tab, g, used, self._shift, self._mask))
            return False

        def done_then(flags) -> None:
            done(flags[2])
            if then is not None:
                then()

        tab, shift, mask = self._tab, self._shift, self._mask
        self._start(lambda flags: T.drop_generation_flagged(tab, g, used, shift, mask, flags), done_then, readable=False)
        return True

    def _trim(self) -> None:
        """Drop the oldest generations while the holder sets push the bytes over the budget (in the
        background: one at a time, the next check when it is done)."""
        while self._bytes() > self._budget and self._entries and self._job is None:
            if len(self._order) == 1:  # the newest alone overflows: start over
                if self._drop(then=self._restart):
                    return
                self._new_generation()
            elif self._drop(then=self._trim):
                return

    def _restart(self) -> None:
        self._new_generation()
        self._trim()

    def _check_budget(self) -> None:
        if self._job is not None:
            return  # checked again when the pass is done (its own trim, or the next record's)
        self._sets_grew = False
        if self._bytes() > self._budget:
            self._trim()
