"""The kinds of the twin's events (:class:`steersman.twin.core.Twin`'s heap entries: ``(time, seq, kind, data)``)."""

from __future__ import annotations

_ARRIVAL, _WAKE, _EXPIRE, _DRILL, _PULL, _DELIVER, _RETRY = range(7)
_KV = 16  # a disaggregated request's KV reached its decode replica (steersman.twin.pd)
_DEADLINE = 17  # a dispatched request's deadline (steersman.twin._deadlines)
_SCRAPE = 18  # a replica's metrics read one scrape interval after a change the last read was too recent for
