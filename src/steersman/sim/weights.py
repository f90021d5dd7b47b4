"""The engine model's weights: ``cold`` -> ``loading`` -> ``warm``, and unloading."""

from __future__ import annotations

from steersman.sim.engine_types import WeightsState

__all__ = ["WeightsMixin"]


class WeightsMixin:
    """The weights half of :class:`~steersman.sim.engine.EngineModel` (its state lives there)."""

    @property
    def weights(self) -> WeightsState:
        return self._weights

    def load_seconds(self) -> float:
        return self.model.weight_bytes_per_gpu(self.tp) / (self.settings.weight_load_gbps * 1e9)

    def begin_load(self, now: float) -> float:
        """Start loading weights (no-op unless cold); returns when they are ready."""
        if self._weights is WeightsState.COLD:
            self._weights = WeightsState.LOADING
            self._ready_at = now + self.load_seconds()
            self._ver += 1
        assert self._ready_at is not None
        return self._ready_at

    def unload(self) -> None:
        """Weights gone: cold, KV cache dropped, running requests back to waiting (front, in order)."""
        s = self._s
        for req in reversed(self._materialise_all()):
            s.preempt(req)
            s.num_preemptions -= 1  # not a scheduler preemption
            req.num_preemptions -= 1
        s.kv.reset()
        self._weights = WeightsState.COLD
        self._ready_at = None
        self._ver += 1

    def _warm_at(self, now: float) -> bool:
        if self._weights is WeightsState.LOADING and now >= self._ready_at:  # type: ignore[operator]
            self._weights = WeightsState.WARM
        return self._weights is WeightsState.WARM

    def next_event_time(self, now: float) -> float | None:
        """When the next step could start, or None (idle, or cold with nothing loading)."""
        if not self.has_work() or self._weights is WeightsState.COLD:
            return None
        t = now if now > self._busy_until else self._busy_until
        if self._weights is WeightsState.LOADING and self._ready_at > t:  # type: ignore[operator]
            t = self._ready_at  # type: ignore[assignment]
        return t
