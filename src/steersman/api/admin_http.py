"""The gateway's admin endpoints over HTTP (guarded by :class:`~steersman.api.admin.AdminGuard`): ``GET /metrics``,
``GET /admin/fleet``, ``POST /admin/replicas/{name}/drain`` and ``.../resume``, ``POST /admin/reload``.  A mixin of
:class:`~steersman.api.gateway.Gateway` (its ``admin``, ``fleet``, ``metrics``, ``kick``, ``cfg``, ``tenants``,
``reload_from``)."""

from __future__ import annotations

import asyncio
import logging

import orjson

from steersman.api.admin import fleet_view, replica_action
from steersman.api.errors import ApiError
from steersman.api.reload import reload_plan
from steersman.fleet.config import FleetConfigError
from steersman.http.server import HttpRequest

__all__ = ["AdminEndpoints"]

log = logging.getLogger("steersman.gateway")


class AdminEndpoints:
    def _admin_refused(self, request: HttpRequest) -> bool:
        err = self.admin.check(request.headers.get("authorization"))
        if err is not None:
            request.respond(err.status, err.body())
        return err is not None

    async def admin_fleet(self, request: HttpRequest) -> None:
        if self._admin_refused(request):
            return
        assert self.fleet is not None
        request.respond(200, orjson.dumps(fleet_view(self.fleet)))

    async def admin_replica(self, request: HttpRequest) -> None:
        if self._admin_refused(request):
            return
        assert self.fleet is not None
        try:
            index, action = replica_action(self.fleet, request.path)
        except ApiError as e:
            request.respond(e.status, e.body())
            return
        self.fleet.set_draining(index, action == "drain")
        name = self.fleet.replicas[index].name
        log.warning("replica %s %s by an operator (%d request(s) under way there)", name,
                    "drained: out of rotation" if action == "drain" else "resumed: back in rotation",
                    int(self.fleet.in_flight[index]))
        if action == "resume":
            self.kick()  # queued requests may go there now
        view = next(r for r in fleet_view(self.fleet)["replicas"] if r["name"] == name)
        request.respond(200, orjson.dumps(view))

    async def metrics_handler(self, request: HttpRequest) -> None:
        if self._admin_refused(request):
            return
        request.respond(200, self.metrics.render(), b"text/plain; version=0.0.4; charset=utf-8")

    async def admin_reload(self, request: HttpRequest) -> None:
        """``POST /admin/reload`` (steersman.api.reload): the fleet file read again, its tenants and keys applied.
        Reloads run one at a time, each reading the file when its turn comes (a later write is never overwritten by
        an earlier read that finished last)."""
        if self._admin_refused(request):
            return
        err = None
        if self.reload_from is None:
            err = ApiError(409, "This gateway was not started from a fleet file (`steersman up`, or built in code): "
                           "there is nothing to read again. Start it with `steersman serve --config FILE` to reload "
                           "its tenants and API keys.", "invalid_request_error", None, "no_fleet_file")
        elif self.admin.open:  # it changes who may use the gateway: never on an open admin surface
            err = ApiError(403, "POST /admin/reload changes the gateway's tenants and API keys: it needs an admin key "
                           "(gateway.admin_key_sha256 in the fleet file, `steersman keys create` makes one; a restart "
                           "then applies both).", "permission_error", None, "admin_key_required")
        if err is not None:
            request.respond(err.status, err.body())
            return
        lock = self._reload_lock
        if lock is None:
            lock = self._reload_lock = asyncio.Lock()
        async with lock:
            # (reading, parsing, importing plugins: off the loop; a client gone meanwhile cancels this handler, but the
            # lock is kept until the read has ended: the next reload reads after it)
            read = asyncio.ensure_future(asyncio.to_thread(self.reload_from))
            try:
                new = await asyncio.shield(read)
            except asyncio.CancelledError:
                await asyncio.wait([read])
                if not read.cancelled():
                    read.exception()  # (its outcome is nobody's now: retrieved, not logged as never retrieved)
                raise
            except (Exception, SystemExit) as e:  # noqa: BLE001 -- a file (or a plugin) may fail in any way: say so
                why = str(e) if isinstance(e, FleetConfigError) else f"{type(e).__name__}: {e}"
                err = ApiError(400, f"The fleet file was not reloaded (nothing changed): {why}", "invalid_request_error",
                               None, "invalid_fleet_file")
                request.respond(err.status, err.body())
                return
            plan = reload_plan(self.cfg, new, self.tenants)
            if isinstance(plan, ApiError):
                request.respond(plan.status, plan.body())
                return
            if plan.applies:
                self.tenants.replace_with(plan.tenants)
                log.warning("fleet file reloaded by an operator: tenants added %s, removed %s, changed %s; %d API "
                            "key(s)%s", list(plan.added), list(plan.removed), list(plan.changed), plan.keys_after,
                            f"; not applied (restart to apply): {', '.join(plan.not_applied)}" if plan.not_applied
                            else "")
        request.respond(200, orjson.dumps(plan.body()))
