"""How many output tokens a request will probably produce: an online estimate per (model, tenant).

A request's ``max_tokens`` is a limit, not a forecast: agent frameworks send
2048-4096 and use a few hundred.  Pricing the decode at the limit makes the
decode term swamp everything else a routing decision weighs (the prefill a
cached prefix saves, above all).  So the scheduler expects, for a request:

    min(estimate(model, tenant), max_tokens)

where ``estimate`` is an exponentially weighted mean (smoothing
``SchedulerSettings.latency_ewma_alpha``) of the completion tokens of the
successful requests that tenant sent to that model; before a tenant's first
completion, the model's mean over every tenant; before any completion,
``SchedulerSettings.initial_output_estimate``.

Pure and synchronous, fed from request-end accounting
(:class:`steersman.control.accounting.Accounting`), so the live gateway and the
digital twin compute it identically.
"""

from __future__ import annotations

__all__ = ["OutputEstimate"]


class OutputEstimate:
    """EWMA of observed completion tokens per (model, tenant) and per model."""

    __slots__ = ("alpha", "initial", "_by_tenant", "_by_model")

    def __init__(self, alpha: float, initial: int) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if initial < 1:
            raise ValueError(f"initial estimate must be >= 1, got {initial}")
        self.alpha = alpha
        self.initial = initial
        self._by_tenant: dict[tuple[str, str], float] = {}
        self._by_model: dict[str, float] = {}

    def observe(self, model: str, tenant: str | None, output_tokens: int) -> None:
        """A request of ``tenant`` to ``model`` completed with ``output_tokens`` tokens."""
        if output_tokens <= 0:
            return
        self._by_model[model] = self._update(self._by_model.get(model), output_tokens)
        if tenant is not None:
            key = (model, tenant)
            self._by_tenant[key] = self._update(self._by_tenant.get(key), output_tokens)

    def _update(self, old: float | None, x: int) -> float:
        return float(x) if old is None else old + self.alpha * (x - old)

    def mean(self, model: str, tenant: str | None = None) -> float:
        """The running mean for (model, tenant), else the model's, else the initial estimate."""
        if tenant is not None:
            v = self._by_tenant.get((model, tenant))
            if v is not None:
                return v
        v = self._by_model.get(model)
        return self.initial if v is None else v

    def expected(self, model: str, tenant: str | None = None, max_tokens: int | None = None) -> int:
        """Output tokens to expect: the running mean (rounded, at least 1), capped by ``max_tokens``."""
        est = max(1, int(round(self.mean(model, tenant))))
        if max_tokens is not None:
            est = min(est, max(int(max_tokens), 0))
        return est
