"""Implementation of ``bench/loadgen.py`` (import from ``loadgen``, not from here).

- :mod:`lg.bodies` - request bodies, JSON encoding, the "carries content" test
- :mod:`lg.records` - per-request :class:`Record`, :class:`RunResult`, percentiles, text summary
- :mod:`lg.raw` - the raw asyncio HTTP/1.1 + SSE client connection (default client)
- :mod:`lg.aiohttp_client` - the aiohttp client (cross-check)
- :mod:`lg.generator` - :class:`LoadGen`, the closed loop over either client
"""
