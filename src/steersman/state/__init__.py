"""State shared between gateway processes, kept in a real server (Redis)."""

from steersman.state.redis_responses import RedisResponseStore
from steersman.state.shared_limits import SharedLimits

__all__ = ["RedisResponseStore", "SharedLimits"]
