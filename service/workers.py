"""Several server processes on one port (``ccrk serve --workers N``).

Each process binds a listening socket of its own with SO_REUSEPORT, so the kernel spreads new connections
evenly over them. With one listening socket shared by all (uvicorn's ``--workers``), whichever process
wakes first takes the connection: 31 of a client's 32 keep-alive connections on one process was seen here,
which leaves the other process idle while the first queues. Each process builds the app from the
environment (``service.app:create_app`` reads the settings); the group restarts a process that dies once
it has started serving, and stops (with that exit code) when one dies before, as a bad setting would make
every restart fail again.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from types import FrameType

log = logging.getLogger("uvicorn.error")

STOP_TIMEOUT_S = 20.0


class PortInUseError(OSError):
    """Another server already listens on the port."""


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return family, address


def check_port_free(host: str, port: int) -> None:
    """Bind once without SO_REUSEPORT: fails when anything listens there, including another group of
    ours (whose SO_REUSEPORT sockets would otherwise silently share the port with this one)."""
    family, address = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortInUseError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _serve_one(host: str, port: int, log_level: str, access_log: bool, started: EventType) -> None:
    """A worker process: its own SO_REUSEPORT socket, the app from the environment, uvicorn; ``started``
    is set once the app's lifespan has started (model and index loaded)."""
    import uvicorn

    family, address = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    config = uvicorn.Config(
        "service.app:create_app",
        factory=True,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
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
    server.run(sockets=[sock])


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
        self.args = (host, port, log_level, access_log)
        self._context = multiprocessing.get_context("spawn")  # fresh interpreters: nothing inherited
        self._stop = threading.Event()
        self._processes: list[tuple[BaseProcess, EventType]] = []

    def _start_one(self) -> tuple[BaseProcess, EventType]:
        started = self._context.Event()
        process = self._context.Process(
            target=_serve_one, args=(*self.args, started), name="ccrk-serve-worker"
        )
        process.start()
        return process, started

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; the exit code (0, or a process's code when it failed to start)."""
        check_port_free(*self.args[:2])
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        code = 0
        try:
            self._processes = [self._start_one() for _ in range(self.workers)]
            log.info("serving with %d processes on %s:%s", self.workers, *self.args[:2])
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
                    self._processes[n] = self._start_one()
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
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
