"""State shared between gateway processes, kept in a real server (Redis)."""

from steersman.state.redis_responses import RedisResponseStore

__all__ = ["RedisResponseStore"]
