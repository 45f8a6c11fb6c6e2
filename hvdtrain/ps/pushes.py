"""The real server's side of a push's messages: the ServerPort (engines/server_engine.py) through which
the server engine reads a worker's gradient out of its shard and answers it over MPI. What a push
does is the engine's; this class moves the chunks and the replies."""

from __future__ import annotations

from .protocol import Kind


class ShardPort:
    def __init__(self, server, shard):
        self.server, self.shard = server, shard
        # The per-push path calls these straight: no wrapper in between. A chunk's send is
        # non-blocking: the worker copies chunk i out while this process receives and updates
        # chunk i+1, so the two directions overlap on two cores.
        self.load = lambda worker: shard.host.sync()  # its stores happened before its header
        self.gradient_chunk = shard.gradient_chunk
        self.chunk_applied = shard.send_chunk  # returns the send's request
        self.discard = shard.discard_gradient

    def reply(self, worker: int, want_params: bool) -> None:
        self.server.reply(worker, want_params)

    def start_stream(self, worker: int) -> bool:
        server = self.server
        stopping = server.engine.stopping
        if server.pauses.holds(worker, stopping):
            return False  # the reply waits for the pause; it goes out whole
        server.pauses.send_debt(worker, stopping)
        return True

    def streamed(self, worker: int, handles: list) -> None:
        self.server.MPI.Request.Waitall(handles)
        self.server.engine.sent_params(worker)

    def begin_stop(self) -> None:
        self.server.begin_stop()

    def round_closed(self, workers: list[int], stop: bool, version: int) -> None:
        self.server.verdicts.tell(Kind.ROUND, workers, stop, version)

    def dropped(self, worker: int, stop: bool, version: int) -> None:
        self.server.verdicts.tell(Kind.DROP, [worker], stop, version)
