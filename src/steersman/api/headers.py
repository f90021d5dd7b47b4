"""steersman's request headers, parsed into typed values (400 naming the header on bad input).

==================================  ==============================================================
header                              meaning
==================================  ==============================================================
``x-steersman-deadline-ms``         the whole response must be complete within this many ms
``x-steersman-slo``                 an SLO class from config (``interactive``, ``standard``, ``batch``)
==================================  ==============================================================

The workflow headers (``x-steersman-workflow-id``, ``-step``, ``-steps``) are read by
:func:`steersman.control.workflow.parse_workflow_headers`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from steersman.api.errors import ApiError, bad_request
from steersman.config import SchedulerSettings
from steersman.obs.tracing import request_id
from steersman.policy.request import LatencyBudget

__all__ = ["parse_budget", "tag_request_id", "DEADLINE", "SLO"]

DEADLINE = "x-steersman-deadline-ms"
SLO = "x-steersman-slo"
_MAX_DEADLINE_MS = 7 * 24 * 3600 * 1000.0


def _header_error(name: str, message: str) -> ApiError:
    return bad_request(f"Header `{name}` {message}", name, "invalid_header")


def parse_budget(headers: Mapping[str, str], now: float, settings: SchedulerSettings) -> LatencyBudget:
    """Headers are lower-cased names; ``now`` anchors the deadline on the gateway's clock."""
    slo_name = headers.get(SLO)
    if slo_name is not None:
        slo_name = slo_name.strip().lower()
        if slo_name not in settings.slo_classes:
            raise _header_error(SLO, f"must be one of {', '.join(sorted(settings.slo_classes))}, got {slo_name[:40]!r}.")
    cls = settings.slo_classes.get(slo_name or settings.default_slo)
    deadline = None
    raw = headers.get(DEADLINE)
    if raw is not None:
        try:
            if "_" in raw:  # (Python's float() takes "1_000"; no HTTP client means that)
                raise ValueError(raw)
            ms = float(raw)
        except ValueError:
            raise _header_error(DEADLINE, f"must be a number of milliseconds, got {raw[:40]!r}.") from None
        if not math.isfinite(ms) or ms <= 0 or ms > _MAX_DEADLINE_MS:
            raise _header_error(DEADLINE, f"must be more than 0 and at most {_MAX_DEADLINE_MS:.0f} ms (7 days), "
                                          f"got {raw[:40]!r}.")
        deadline = now + ms / 1000.0
    return LatencyBudget(
        ttft_s=cls.ttft_s if cls else None,
        tpot_s=cls.tpot_s if cls else None,
        deadline=deadline,
        slo_class=slo_name or settings.default_slo,
    )


def tag_request_id(request) -> str:
    """The request's id (the client's X-Request-Id when valid, else a new one), on every answer to it."""
    rid = request_id(request.headers.get("x-request-id"))
    request.extra_headers = b"X-Request-Id: %b\r\n" % rid.encode()
    return rid
