"""``POST /admin/reload``: the fleet file read again, its tenants and API keys applied in place.

An operator adds a customer's key, revokes one, or changes a tenant's limits, budget, priority or concurrency without
restarting the gateway (LiteLLM manages its keys at runtime the same way; nginx and HAProxy reload on a signal, which
here stays a graceful stop: a closed terminal's SIGHUP).  The whole file is read and checked as at startup: a file
that does not parse changes nothing.  What the gateway applies in place is the ``tenants:`` and ``api_keys:``
sections: from the next request on, a new key authenticates, a removed one is a 401, a tenant's changed limits apply
(its token buckets start full at the new rates); requests under way keep the tenant settings they were admitted with.
The other sections (engines, gateway, scheduler, admission, reliability, policy, profiles) are compared and named as
``not_applied`` when they differ: those take a restart, or a handover to a second gateway on the same port
(``gateway.reuse_port``).  A reload that would turn a gateway with API keys into an open one (every request served
as the open tenant, unauthenticated) is refused: a file whose keys were lost by mistake must not open the gateway.

:func:`reload_plan` is pure: the old and new configurations in, what to apply (or why not) out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from steersman.api.errors import ApiError
from steersman.control.tenants import TenantConfigError, TenantDirectory

__all__ = ["ReloadPlan", "reload_plan", "directory_of", "SECTIONS"]

#: the fleet file's sections besides tenants and api_keys, as FleetConfig names them: compared, not applied
SECTIONS = ("endpoints", "simulated", "gateway", "scheduler", "admission", "reliability", "policy", "profiles")


def directory_of(cfg: Any) -> TenantDirectory:
    """The tenants a gateway starts with for ``cfg`` (a FleetConfig): its own, or the open tenant alone."""
    return cfg.tenants or TenantDirectory.from_data({}, "open mode", cfg.admission)


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    tenants: TenantDirectory  # what the gateway's directory becomes
    added: tuple[str, ...]  # tenants by name
    removed: tuple[str, ...]
    changed: tuple[str, ...]  # tenants whose settings differ
    keys_before: int
    keys_after: int
    not_applied: tuple[str, ...]  # sections that differ and take a restart
    applies: bool  # the tenants or keys change (a key replaced by another counts: same count, other digest)

    def body(self) -> dict:
        return {
            "object": "fleet.reload",
            "applied": ["tenants"] if self.applies else [],
            "tenants": {"added": list(self.added), "removed": list(self.removed), "changed": list(self.changed),
                        "total": len(self.tenants.tenants)},
            "api_keys": {"before": self.keys_before, "after": self.keys_after},
            "open": self.tenants.open,
            "not_applied": list(self.not_applied),
            "message": (f"kept as started: {', '.join(self.not_applied)} changed in the fleet file; restart the "
                        "gateway, or hand over to a new one on the same port (gateway.reuse_port), to apply them")
            if self.not_applied else "the fleet file's other sections are as the gateway started with",
        }


def reload_plan(old: Any, new: Any, current: TenantDirectory) -> ReloadPlan | ApiError:
    """What reloading ``new`` (a FleetConfig read again) over a gateway started with ``old`` and running with the
    directory ``current`` does, or the error refusing it.  The new tenants are built with the admission settings the
    gateway runs with (``old``'s: a changed ``admission`` section is not applied, its default priority included)."""
    try:
        if new.tenants is None:
            fresh = TenantDirectory.from_data({}, "open mode", old.admission)
        elif new.tenants_doc is not None:
            fresh = TenantDirectory.from_data(new.tenants_doc.data, "the reloaded fleet file", old.admission)
        else:  # (a configuration built in code: its directory as it is)
            fresh = new.tenants
    except TenantConfigError as e:
        return ApiError(400, f"The fleet file was not reloaded (nothing changed): {e}", "invalid_request_error", None,
                        "invalid_fleet_file")
    if not current.open and fresh.open:
        return ApiError(409, "The reloaded fleet file configures no api_keys: the gateway would run open, serving every "
                        "request unauthenticated as tenant " f"{fresh.open_tenant.name!r}. Not reloaded (nothing "
                        "changed); to run it open, restart it with that file.", "invalid_request_error", None,
                        "reload_refused")
    was, now = current.tenants, fresh.tenants
    if current.open:  # (the open tenant serves every request: compared as a tenant of its own)
        was = {**was, current.open_tenant.name: current.open_tenant}
    if fresh.open:
        now = {**now, fresh.open_tenant.name: fresh.open_tenant}
    not_applied = tuple(s for s in SECTIONS if getattr(old, s) != getattr(new, s))
    return ReloadPlan(
        fresh, tuple(sorted(set(now) - set(was))), tuple(sorted(set(was) - set(now))),
        tuple(sorted(n for n in set(was) & set(now) if was[n] != now[n])), current.key_count, fresh.key_count,
        not_applied, not current.same_as(fresh))
