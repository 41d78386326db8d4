"""Every rank of a multi-rank reference server learns of a peer's death, for certain.

gloo alone does not tell it. A root's `broadcast` to a peer that was SIGKILLed can wait for ever:
the pair's "connection closed" never reaches that wait, and the collective timeout is a day, so
that a SIGSTOPped rank never turns into a timeout. Within a node the server's watcher sees a rank
exit; across nodes only gloo could, and then a killed follower rank could leave node 0's requests
hanging instead of failing.

A lifeline is one TCP connection between rank 0 and each other rank, which carries nothing. The
kernel closes it when either process dies, by any path. A blocking `recv` then returns, and the
rank that sees it stops with status 1, as a collective's error stops it. Its node's own watcher
then brings the node down (the SIGQUIT path on node 0, SIGKILL of the node on the others). A
stopped process keeps its sockets, so a SIGSTOP fault is not a death.

A normal end is told apart. Rank 0 calls `closing` before it broadcasts the exit message, and the
others call it when they receive that message. A rank whose lifeline closes before it called
`closing` waits `GRACE_S` for it: rank 0 may exit before a peer has read the exit message.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

ACCEPT_S = 120.0
"""How long rank 0 waits for every peer to connect. They connect right after the world group
formed, so only a peer that died at start-up is late."""
GRACE_S = 2.0
"""How long a closed lifeline waits for this rank's own exit message before it calls the peer dead."""
_RANK = struct.Struct("<I")


class Lifelines:
    """This rank's lifelines: to every peer on rank 0, to rank 0 on the others."""

    def __init__(self, rank: int, peers: dict[int, socket.socket],
                 on_death: Callable[[str], None] | None = None) -> None:
        self.rank = rank
        self._closing = threading.Event()
        self._on_death = on_death or _stop
        for peer, sock in peers.items():
            threading.Thread(target=self._watch, args=(peer, sock), name=f"lifeline-{peer}",
                             daemon=True).start()

    @classmethod
    def join(cls, rank: int, world: int, rendezvous: str, exchange: Callable[[list[Any]], list[Any]],
             on_death: Callable[[str], None] | None = None) -> Lifelines:
        """Connect the lifelines of a world of `world` ranks. Every rank calls it at the same point:
        `exchange` is the world's broadcast from rank 0 (it carries rank 0's port to the others).
        Rank 0 listens on the rendezvous host, the address that every node already reaches.
        `on_death` gets the line to log when a peer dies; by default the rank logs it and stops."""
        host = urlsplit(rendezvous).hostname or "127.0.0.1"
        if rank == 0:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.create_server((host, 0), family=family, backlog=max(world, 1)) as server:
                exchange([server.getsockname()[1]])
                server.settimeout(ACCEPT_S)
                peers: dict[int, socket.socket] = {}
                while len(peers) < world - 1:
                    sock, _ = server.accept()
                    sock.settimeout(ACCEPT_S)
                    peer = _RANK.unpack(_read(sock, _RANK.size))[0]
                    sock.settimeout(None)
                    peers[peer] = sock
            return cls(rank, peers, on_death)
        port = int(exchange([None])[0])
        sock = socket.create_connection((host, port), timeout=ACCEPT_S)
        sock.sendall(_RANK.pack(rank))
        sock.settimeout(None)
        return cls(rank, {0: sock}, on_death)

    def closing(self) -> None:
        """The normal end has begun: a lifeline that closes from now on is no death."""
        self._closing.set()

    def _watch(self, peer: int, sock: socket.socket) -> None:
        try:
            while sock.recv(64):
                pass  # nothing is ever sent; whatever came is not a death
        except OSError:
            pass
        if self._closing.wait(GRACE_S):
            return
        self._on_death(f"cptest-ref rank {self.rank}: stopping: rank {peer}'s lifeline closed "
                       "(that rank died)")


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("a peer closed its lifeline before it said its rank")
        data += chunk
    return data


def _stop(line: str) -> None:
    """A peer died: say so in the log and stop this rank at once, whatever its main thread waits on
    (a collective that never returns)."""
    print(line, file=sys.stdout, flush=True)
    os._exit(1)
