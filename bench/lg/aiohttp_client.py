"""The aiohttp client (a cross-check for the raw one): ``ClientSession`` + one task per stream.

aiohttp sets TCP_NODELAY on every connection
(``aiohttp.base_protocol.BaseProtocol.connection_made``). Imported only when
``LoadGen(client="aiohttp")`` is used, so aiohttp stays optional.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import aiohttp

from lg.bodies import CONTENT_RE
from lg.records import Record

if TYPE_CHECKING:
    from lg.generator import LoadGen

_ns = time.perf_counter_ns


def open_session(concurrency: int, timeout: float) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False, enable_cleanup_closed=False)
    return aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=timeout), skip_auto_headers=("User-Agent",),
    )


async def worker(gen: LoadGen) -> None:
    """One closed-loop stream: post, read the body as it arrives, record; until the run is over."""
    s = gen._session
    hdrs = {k: v for k, v in gen.headers.items() if k not in ("Host", "Content-Length")}
    while gen._left > 0 and _ns() < gen._deadline_ns:
        gen._left -= 1
        rec = Record(_ns())
        try:
            async with s.post(gen.url, data=gen.body, headers=hdrs) as resp:
                rec.status = resp.status
                buf = b""
                last = 0
                async for data in resp.content.iter_any():
                    t = _ns()
                    rec.nbytes += len(data)
                    buf += data
                    if b"\r" in buf:
                        buf = buf.replace(b"\r\n", b"\n")
                    start = 0
                    while True:
                        j = buf.find(b"\n\n", start)
                        if j < 0:
                            break
                        ev = buf[start:j]
                        start = j + 2
                        if not ev.startswith(b"data:"):
                            k = ev.find(b"\ndata:")
                            if k < 0:
                                continue
                            ev = ev[k + 1 :]
                        payload = ev[5:].strip()
                        if payload == b"[DONE]":
                            rec.done = True
                        elif rec.ttft_ns < 0:
                            if CONTENT_RE.search(payload) is not None:
                                rec.ttft_ns = t - rec.start_ns
                                rec.chunks = 1
                                last = t
                        else:
                            rec.gaps_ns.append(t - last)
                            last = t
                            rec.chunks += 1
                    buf = buf[start:]
            rec.e2e_ns = _ns() - rec.start_ns
        except TimeoutError:
            rec.status = -1
            rec.error = "timeout"
        except Exception as e:  # noqa: BLE001 - record and go on
            rec.error = repr(e)
        gen._records.append(rec)

