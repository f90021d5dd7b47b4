"""The gateway's HTTP/1.1 stack: asyncio protocols + httptools, on uvloop.

:mod:`~steersman.http.server` answers clients; :mod:`~steersman.http.client`
talks to engines over pooled keep-alive connections.  Streams are relayed from
``data_received`` to the client socket without an await per chunk.
"""

from steersman.http.client import Endpoint, Exchange, UpstreamError, UpstreamPool
from steersman.http.server import HttpRequest, HttpServer

__all__ = ["Endpoint", "Exchange", "HttpRequest", "HttpServer", "UpstreamError", "UpstreamPool"]
