"""The scripted server tests run against: whatever its clients did, it closes every
connection it accepted when it stops, so no socket is left to the garbage collector (an
unclosed-socket warning, an error under the suite's `filterwarnings`, in a later test)."""

from __future__ import annotations

import gc
import socket
import ssl
import warnings

import pytest
import trustme

from loadgen.testing import ScriptedServer, simple_chat


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_client_that_connects_and_leaves_at_the_stop_leaves_no_socket_behind(tls: bool) -> None:
    """A client connecting and closing just before the server stops (as `run --dry-run`'s
    reachability check does) leaves nothing open, over 30 stops."""
    context = None
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        trustme.CA().issue_cert("127.0.0.1").configure_cert(context)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(30):
            with ScriptedServer(lambda r: simple_chat(1), ssl=context) as server:
                socket.create_connection(("127.0.0.1", server.port)).close()
            gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
