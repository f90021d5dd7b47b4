"""What is wrong with a URL a setting names, as the settings' errors say it (``None``: nothing): checked when the
fleet file is read, so that a typo is an error naming its key, not a traceback (or a silently different target)
once the gateway starts."""

from __future__ import annotations

from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

__all__ = ["http_url_problem", "redis_url_problem", "split_url"]

_BAD_PORT = "has a port that is not a number 1 to 65535"


def split_url(url: str) -> tuple[SplitResult | None, str | None]:
    """``url`` split, with its port checked (a number 1 to 65535, or none), or why it cannot be."""
    try:
        u = urlsplit(url)
        port = u.port  # "Port out of range 0-65535", "Port could not be cast to integer value as '80a'"
    except ValueError as e:
        if "IPv6" in str(e):  # urlsplit: "Invalid IPv6 URL" (a '[' without its ']', or the other way round)
            return None, "is not a URL: an IPv6 address is written in brackets, [::1]"
        return None, _BAD_PORT
    if port == 0:
        return None, _BAD_PORT
    return u, None


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is no http(s) URL a client can connect to: scheme, host and port."""
    if not url.startswith(("http://", "https://")):
        return "must be an http(s) URL"
    u, problem = split_url(url)
    if u is None:
        return problem
    if not u.hostname:
        return "has no host"
    return None


def redis_url_problem(url: str) -> str | None:
    """Why ``url`` is no URL redis-py connects to as written (``redis.connection.parse_url``): a redis:// or
    rediss:// URL with a port 1 to 65535 and a path that is a database number (``/0``), or a unix:// socket."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return "must be a redis://, rediss:// or unix:// URL"
    u, problem = split_url(url)
    if u is None:
        return problem
    if u.scheme != "unix" and "db" not in parse_qs(u.query):  # (redis-py takes ?db= first, and then the path)
        db = unquote(u.path).replace("/", "")  # as redis-py reads it, which takes database 0 for any other path
        if db and not (db.isascii() and db.isdigit()):
            return (f"has the path {u.path[:40]!r}, not a database number (redis://host:port/<db>, e.g. /0): redis-py "
                    "would use database 0")
    return None
