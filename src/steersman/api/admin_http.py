"""The gateway's admin endpoints over HTTP (guarded by :class:`~steersman.api.admin.AdminGuard`): ``GET /metrics``,
``GET /admin/fleet``, ``POST /admin/replicas/{name}/drain`` and ``.../resume``.  A mixin of
:class:`~steersman.api.gateway.Gateway` (its ``admin``, ``fleet``, ``metrics``, ``kick``)."""

from __future__ import annotations

import logging

import orjson

from steersman.api.admin import fleet_view, replica_action
from steersman.api.errors import ApiError
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
