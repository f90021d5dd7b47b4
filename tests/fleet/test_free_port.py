"""free_port() never gives one process the same port twice: a port is given before its server binds it, and the
kernel can give a port that was just closed again at once (the chaos soak ran two of its four "replicas" on one
engine-sim that way)."""

from __future__ import annotations

import socket

from steersman.fleet import processes
from steersman.fleet.processes import free_port


def test_ports_given_one_after_another_are_distinct_and_free():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing listens there


def test_a_port_the_kernel_gives_again_is_skipped(monkeypatch):
    """The kernel's answer repeats (as it did in the soak): the repeat is skipped, the next new one is given."""
    answers = iter([41001, 41001, 41001, 41002])

    class FakeSocket:
        def __init__(self, *a):
            self.port = None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, addr):
            self.port = next(answers)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(processes, "_HANDED_OUT", processes.collections.deque(maxlen=4096))
    monkeypatch.setattr(processes.socket, "socket", FakeSocket)
    assert free_port() == 41001
    assert free_port() == 41002
