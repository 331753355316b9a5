"""Several server processes on one port (``ccrk serve --workers N``).

The group binds one listening socket and every process accepts from it, least connections first: a process
takes a waiting connection at once when it holds no more open connections than any other serving process,
and otherwise leaves it to them for ``HOLD_S`` (then takes it, in case they are stuck). Front ends keep a
pool of keep-alive connections, so where a connection lands decides where its requests go for its whole
life. Neither kernel way spreads them evenly: with one shared socket and plain accepting, whichever process
wakes first takes what waits (31 of a client's 32 connections on one process was seen here), and with one
SO_REUSEPORT socket per process the kernel hashes each connection to a process (splits of 32 connections
seen here, 2 processes: 16/16 to 23/9; at 400 queries/s the 1M-item open-loop p99 went with the split).

Each process builds the app from the environment (``service.app:create_app`` reads the settings); the group
restarts a process that dies once it has started serving, and stops (with that exit code) when one dies
before, as a bad setting would make every restart fail again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from types import FrameType
from typing import Any

log = logging.getLogger("uvicorn.error")

STOP_TIMEOUT_S = 20.0
BACKLOG = 2048  # uvicorn's default
# How long a process leaves a waiting connection to a less loaded one before taking it itself: long enough
# for a busy event loop to come round (a request's Python work is ~1 ms), short for a connect.
HOLD_S = 0.005
ACCEPT_RETRY_S = 0.1


class PortInUseError(OSError):
    """Another server already listens on the port."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The group's listening socket. Bound without SO_REUSEPORT, so it fails when anything listens there."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
    try:
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise PortInUseError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


class ConnectionSlots:
    """Open connections per process of the group, in memory shared by all (-1: not serving). Each process
    writes only its own slot; a single aligned 64-bit store or load is atomic, and the balance needs no
    more than a recent value."""

    def __init__(self, counts: Any, index: int) -> None:
        self.counts = counts
        self.index = index

    def publish(self, connections: int) -> None:
        self.counts[self.index] = connections

    def fewest_elsewhere(self) -> int | None:
        """The fewest connections another serving process holds; None when no other serves."""
        others = [c for i, c in enumerate(self.counts) if i != self.index and c >= 0]
        return min(others) if others else None


class BalancedAcceptor:
    """Accepts connections from the group's socket into uvicorn, least connections first (module doc).

    It stands where uvicorn keeps its asyncio servers (``close``, ``wait_closed``), so uvicorn's shutdown
    stops it before closing the connections."""

    def __init__(
        self,
        listener: socket.socket,
        slots: ConnectionSlots,
        connections: set[Any],
        create_protocol: Callable[[], asyncio.Protocol],
    ) -> None:
        self.listener = listener
        self.slots = slots
        self.connections = connections  # uvicorn's live protocols of this process
        self.create_protocol = create_protocol
        self._task: asyncio.Task[None] | None = None

    def _publish(self, accepting: int = 0) -> int:
        """This process's count for the others: its live connections (plus one being accepted)."""
        count = len(self.connections) + accepting
        self.slots.publish(count)
        return count

    def start(self) -> None:
        self.listener.setblocking(False)
        self._publish()
        self._task = asyncio.get_running_loop().create_task(self._accept_forever())

    def close(self) -> None:
        self.slots.publish(-1)  # the others stop leaving connections to this process
        if self._task is not None:
            self._task.cancel()

    async def wait_closed(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _protocol(self) -> asyncio.Protocol:
        """uvicorn's protocol, publishing this process's count again when its connection ends."""
        protocol = self.create_protocol()
        lost = protocol.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            lost(exc)
            self._publish()

        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self.listener.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(fd)

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._readable()  # every process of the group wakes for a waiting connection
            mine = self._publish()
            fewest = self.slots.fewest_elsewhere()
            if fewest is not None and mine > fewest:
                await asyncio.sleep(HOLD_S)  # a less loaded process should take it; if it has not, we do
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another process took it
            except OSError as exc:  # out of file descriptors, ...: the connection stays queued
                log.error("accept failed: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            self._publish(accepting=1)
            try:
                conn.setblocking(False)
                if conn.family in (socket.AF_INET, socket.AF_INET6):
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvicorn's own servers
                await loop.connect_accepted_socket(self._protocol, conn)
            except OSError as exc:  # the peer is already gone
                log.debug("connection dropped at accept: %s", exc)
                conn.close()
                self._publish()


def _balanced_server(config: Any, listener: socket.socket, slots: ConnectionSlots) -> Any:
    """A uvicorn server whose connections come from a ``BalancedAcceptor`` instead of its own listening
    socket. ``startup`` is uvicorn's (0.54, pinned in constraints.txt) for given sockets, with the acceptor
    in place of ``loop.create_server``; the rest of uvicorn (requests, shutdown) is unchanged."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    class BalancedServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await self.lifespan.startup()
            if self.lifespan.should_exit:
                sys.exit(STARTUP_FAILURE)

            def create_protocol() -> asyncio.Protocol:
                return config.http_protocol_class(
                    config=config, server_state=self.server_state, app_state=self.lifespan.state
                )

            acceptor = BalancedAcceptor(listener, slots, self.server_state.connections, create_protocol)
            acceptor.start()
            self.servers = [acceptor]  # type: ignore[list-item]
            log.info("process %d serving", os.getpid())
            self.started = True

    return BalancedServer(config)


def _serve_one(
    listener: socket.socket,
    counts: Any,
    index: int,
    log_level: str,
    access_log: bool,
    started: EventType,
) -> None:
    """A worker process: the app from the environment on uvicorn, fed by the group's socket; ``started``
    is set once the app's lifespan has started (model and index loaded)."""
    import uvicorn

    from ccrk_settings import get_settings
    from service.http_guard import uvicorn_options

    config = uvicorn.Config(
        "service.app:create_app",
        factory=True,
        log_level=log_level,
        access_log=access_log,
        **uvicorn_options(get_settings()),
    )
    server = _balanced_server(config, listener, ConnectionSlots(counts, index))
    supervisor = os.getppid()

    def watch() -> None:
        """Report the start; then stop gracefully if the supervisor dies (killed with SIGKILL, it cannot
        stop its processes, which would otherwise keep serving and holding the port)."""
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            started.set()
        while not server.should_exit:
            if os.getppid() != supervisor:
                server.should_exit = True
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()
    server.run()


class WorkerGroup:
    def __init__(
        self,
        workers: int,
        host: str,
        port: int,
        *,
        log_level: str,
        access_log: bool,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.workers = workers
        self.on_exit = on_exit or (lambda pid: None)  # a process is gone (its shared state can go too)
        self.host, self.port = host, port
        self.args = (log_level, access_log)
        self._context = multiprocessing.get_context("spawn")  # fresh interpreters: nothing inherited
        self._stop = threading.Event()
        self._processes: list[tuple[BaseProcess, EventType]] = []
        self._listener: socket.socket | None = None
        # Open connections per process (ConnectionSlots), shared with every process; -1: not serving.
        self._counts = self._context.RawArray("q", [-1] * workers)

    def _start_one(self, index: int) -> tuple[BaseProcess, EventType]:
        self._counts[index] = -1  # a replaced process's count goes with it
        started = self._context.Event()
        process = self._context.Process(
            target=_serve_one,
            args=(self._listener, self._counts, index, *self.args, started),
            name="ccrk-serve-worker",
        )
        process.start()
        return process, started

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; the exit code (0, or a process's code when it failed to start)."""
        self._listener = bind_listener(self.host, self.port)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        code = 0
        try:
            self._processes = [self._start_one(n) for n in range(self.workers)]
            log.info("serving with %d processes on %s:%s", self.workers, self.host, self.port)
            while not self._stop.wait(0.5):
                for n, (process, started) in enumerate(self._processes):
                    if process.exitcode is None:
                        continue
                    if not started.is_set():
                        log.error("worker %s failed to start (exit code %s)", process.pid, process.exitcode)
                        code = process.exitcode if (process.exitcode or 0) > 0 else 1
                        self._stop.set()
                        break
                    log.warning("worker %s exited (code %s); starting another", process.pid, process.exitcode)
                    if process.pid is not None:
                        self.on_exit(process.pid)
                    self._processes[n] = self._start_one(n)
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._listener.close()
        return code

    def _shutdown(self) -> None:
        """SIGTERM to every process (uvicorn finishes requests in flight), then SIGKILL what remains."""
        for process, _ in self._processes:
            if process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process, _ in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                with contextlib.suppress(OSError):
                    process.kill()
                process.join(5)
