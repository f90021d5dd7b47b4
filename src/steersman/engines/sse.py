"""An incremental parser for the Server-Sent Events an engine streams.

:class:`SseParser` is fed bytes exactly as the upstream connection delivers them
(whole events, several at once, or one byte at a time) and returns the complete
events' ``data`` payloads; an incomplete tail waits for the next read.  It
follows the WHATWG event-stream grammar where engines use it: lines end in
``\\n``, ``\\r\\n`` or ``\\r``; a blank line ends an event; lines starting with
``:`` are comments; several ``data:`` lines are joined with ``\\n``; one space
after the colon is dropped; other fields (``event``, ``id``, ``retry``) are
ignored, an event without data is not an event, and a UTF-8 byte order mark
starting the stream is dropped.

The common case (an engine writing ``data: {...}\\n\\n`` events with ``\\n``
line ends) takes a fast path: one ``split`` per read.  An event longer than
``max_event_bytes`` raises :class:`SseError` instead of growing the buffer.
"""

from __future__ import annotations

__all__ = ["SseError", "SseParser", "DONE"]

#: The payload that ends an OpenAI stream.
DONE = b"[DONE]"
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark: the event-stream grammar drops one at the stream's start


class SseError(ValueError):
    """The engine's stream is not a well-formed event stream."""


class SseParser:
    __slots__ = ("max_event_bytes", "_buf", "_slow", "clean")

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = b""
        #: True once a "\r" was seen (every read takes the general path from then on); None before the stream's
        #: first bytes (a BOM to drop)
        self._slow: bool | None = None
        self.clean = False  # the last feed was exactly whole one-line ``data: `` events (relay it as it came)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete event waiting for more input."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The data payloads of the events completed by ``data``."""
        self.clean = False
        whole = True  # ``data`` starts at an event boundary
        if self._buf:
            data = self._buf + data
            self._buf = b""
            whole = False
        elif (data.startswith(b"data: ") and data.endswith(b"\n\n") and data.count(b"\n") == 2
              and not self._slow and 13 not in data):  # 13 is "\r": a byte-value test (memchr), not a substring one
            self.clean = True  # one whole one-line event: the common read of a paced engine
            self._slow = False  # (the stream has started: no BOM from now on)
            return [data[6:-2]]
        if self._slow is None:  # the stream's first bytes
            if _BOM.startswith(data[:3]):
                if len(data) < 3:
                    self._buf = data  # maybe a BOM's first bytes
                    return []
                data = data[3:]
                whole = False  # not relayed as it came
            self._slow = False
        if not self._slow and 13 in data:
            self._slow = True
        if self._slow:
            return self._feed_general(data)
        parts = data.split(b"\n\n")
        rest = parts.pop()
        if len(rest) > self.max_event_bytes:
            raise SseError(f"an event is longer than {self.max_event_bytes} bytes")
        self._buf = rest
        out = []
        clean = whole and not rest
        for ev in parts:
            if ev.startswith(b"data: ") and 10 not in ev:  # no "\n"
                out.append(ev[6:])  # the one-line event every OpenAI server writes
            else:
                clean = False
                if ev:
                    p = _payload(ev.split(b"\n"))
                    if p is not None:
                        out.append(p)
        self.clean = clean
        return out

    def _feed_general(self, data: bytes) -> list[bytes]:
        # normalise line ends; a "\r" at the very end may be the first half of "\r\n": keep it for later
        hold = b""
        if data.endswith(b"\r"):
            data, hold = data[:-1], b"\r"
        norm = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = norm.split(b"\n\n")
        rest = parts.pop()
        if len(rest) > self.max_event_bytes:
            raise SseError(f"an event is longer than {self.max_event_bytes} bytes")
        # a held "\r" ends a line: keep it normalised, but remember a following "\n" belongs to it
        self._buf = rest + hold
        out = []
        for ev in parts:
            p = _payload(ev.split(b"\n"))
            if p is not None:
                out.append(p)
        return out

    def close(self) -> list[bytes]:
        """The stream ended: the payloads of events it still completes.

        A held ``\r`` ends its line; a final ``data: [DONE]`` without the blank
        line is accepted (some servers omit it); any other unfinished event is
        data the engine never completed: :class:`SseError`.
        """
        rest, self._buf = self._buf, b""
        if not rest:
            return []
        norm = rest.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = norm.split(b"\n\n")
        tail = parts.pop()
        out = [p for p in (_payload(ev.split(b"\n")) for ev in parts) if p is not None]
        last = _payload(tail.split(b"\n"))
        if last == DONE:
            out.append(last)
        elif last is not None:
            raise SseError("the stream ended inside an event")
        return out


def _payload(lines: list[bytes]) -> bytes | None:
    data: list[bytes] | None = None
    for line in lines:
        if not line or line[:1] == b":":
            continue
        name, colon, value = line.partition(b":")
        if name != b"data":
            continue  # event / id / retry / unknown fields: nothing continuation needs
        if colon and value[:1] == b" ":
            value = value[1:]
        if data is None:
            data = [value]
        else:
            data.append(value)
    if data is None:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)
