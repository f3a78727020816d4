"""A TCP server on the host's loopback that records every connection made to it, for the tests
that prove a sandboxed notebook reaches no network."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def recording_server() -> Iterator[tuple[int, list[str]]]:
    """(its port, the peers that connected so far) while the server runs."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, peer = server.accept()
            except OSError:  # the timeout: look at `stop` again
                continue
            accepted.append(str(peer))
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()
