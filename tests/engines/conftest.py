"""Fixtures shared by the engine adapter tests."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from steersman.fleet.processes import free_port


@pytest.fixture()
def serve():
    """A prometheus_client registry on 127.0.0.1 (vLLM's and SGLang's /metrics); the paths it was asked."""
    servers = []

    def start(registry: CollectorRegistry) -> tuple[str, list[str]]:
        port = free_port()
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        paths: list[str] = []
        handle = server.RequestHandlerClass.log_message
        server.RequestHandlerClass.log_message = lambda self, *a: paths.append(self.path)  # every request's path
        servers.append((server, thread, handle))
        return f"http://127.0.0.1:{port}", paths

    yield start
    for server, thread, handle in servers:
        server.shutdown()
        server.server_close()
        thread.join(5)
        server.RequestHandlerClass.log_message = handle
