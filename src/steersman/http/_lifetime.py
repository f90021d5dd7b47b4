"""A client connection's lifetime past its requests (a mixin of :class:`~steersman.http._connection._Connection`):
its one timer (a deadline moved later without a new timer), the idle period between requests, the client that stops
taking what was answered, and the refusal at the server's connection bound."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from steersman.http.request import _status_line

_REJECT_GRACE_S = 5.0
# connections refused at the server's bound that wait (up to _REJECT_GRACE_S) for the client to read the 503 and close
# (a socket closed with the request unread resets, and the client may see the reset, not the answer); past these a
# refusal closes at once: a client opening connections and never closing them cannot make refusals hold fds
_MAX_REFUSED_LINGERING = 64
# the server's own 503s (at the connection bound, past the body budget) say when to come back: after a second, as
# the gateway's other 503s by default (scheduler.no_replica_retry_after_s); the whole-second floor of the header
_OVERLOAD_RETRY_AFTER = b"Retry-After: 1\r\n"


class _Lifetime:
    __slots__ = ()

    def _refuse(self, t: asyncio.Transport) -> None:
        """At the server's connection bound, none idle: answer 503 ``overloaded`` now, without reading the request
        (the openai client retries a 503 after ``Retry-After``), and close: unlike :meth:`_reject` the connection
        never counts in the server's ``connections``."""
        srv = self.server
        self._rejected = True  # (what the client sends is discarded)
        body = srv.error_body(503, "The gateway has too many client connections open; retry shortly.", "overloaded")
        t.write(b"%bContent-Type: application/json\r\nContent-Length: %d\r\n%b%bConnection: close\r\n\r\n%b"
                % (_status_line(503), len(body), _OVERLOAD_RETRY_AFTER, srv.error_extra(503, None), body))
        if len(srv.refused) < _MAX_REFUSED_LINGERING and t.can_write_eof():
            # closed when the client closes (eof_received), else after the grace (connection_lost cancels the timer)
            srv.refused.add(self)
            t.write_eof()
            self._timer = self.loop.call_later(_REJECT_GRACE_S, t.close)
        else:
            t.close()

    def _deadline(self, after_s: float, action: Callable[[], None]) -> None:
        loop = self.loop
        due = loop.time() + after_s
        self._due, self._on_due = due, action
        if self._timer is None or self._timer_at > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        if due is None or self.transport is None:
            return
        loop = self.loop
        if loop.time() < due:  # the deadline moved later since the timer was set
            self._timer_at = due
            self._timer = loop.call_at(due, self._fire)
            return
        self._due = None
        self._on_due()  # type: ignore[misc]

    def _arm_idle(self) -> None:
        self.server.idle[self] = None  # (already in it: idle since then, its place kept)
        self._watch_unsent(self.transport)

    def _watch_unsent(self, t: asyncio.Transport) -> None:
        """Between requests (or closing, or waiting for the client to read before the next one): after the idle
        timeout the connection closes, or, its answer still unread, is reset unless the client took some of it
        meanwhile (nginx's send_timeout runs between two successive writes, not over the whole transfer)."""
        self._unsent = t.get_write_buffer_size()
        self._deadline(self.server.idle_timeout_s, self._idle_close)

    def _write_stalled(self) -> None:
        """A response (a stream, a long answer) its client has taken nothing of for the idle timeout: reset, which
        cancels its handler (a stream's engine request with it: a client that stops reading without closing held
        its engine slot, and its tenant's concurrency place, as long as it kept the connection)."""
        t = self.transport
        if t is None or not self._paused_writing:
            return
        left = t.get_write_buffer_size()
        if left < self._unsent:  # taking, slowly: another period
            self._unsent = left
            self._deadline(self.server.idle_timeout_s, self._write_stalled)
        else:
            t.abort()

    def _idle_close(self) -> None:
        t = self.transport
        if self._current is not None or t is None:
            return
        left = t.get_write_buffer_size()
        if not left:
            if not self._queue:
                t.close()
        elif left < self._unsent:  # reading, slowly: another period
            self._watch_unsent(t)
        else:  # nothing taken for a whole period: a close would wait for the client forever
            t.abort()
