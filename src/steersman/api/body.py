"""Reading request bodies with a size limit (413 in OpenAI format, never aiohttp's text page)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from steersman.api.errors import bad_request, too_large

__all__ = ["read_body"]


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or :class:`ApiError` 413 as soon as it exceeds ``limit`` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(limit)
    if declared is not None:
        try:
            return await request.content.readexactly(declared) if declared else b""
        except asyncio.IncompleteReadError:
            raise bad_request("Request body is shorter than its Content-Length.", None, "incomplete_body") from None
    chunks = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)
