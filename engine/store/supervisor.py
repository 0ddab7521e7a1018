"""Keeps the embedded redis-server running, and its folder in place, while subs runs.

Two faults, told apart because they need opposite answers:

- **The server died** (SIGKILL, OOM): start it again on the same socket and AOF,
  backing off while it keeps dying; one log line per restart.
- **Its folder vanished under it** (`rm -rf .subs`, `git clean -fdx`, a tmp cleaner)
  while the server lives. That is not a dead server, and restarting it would throw
  its data away. Redis itself carries on from memory, appending to an AOF file that
  no longer has a name, so everything is lost when it stops; and with its socket file
  gone nobody can connect to it any more. subs does not leave it so: it makes the
  folder again, has the live server write its whole dataset there (`CONFIG SET dir`,
  then `BGREWRITEAOF`, over a connection it holds open for this), and restarts it on
  that AOF, so nothing acknowledged is lost and the socket and the pidfile lock are
  back. Until that is done, or when it cannot be (the path is taken by something else,
  the parent folder is gone, the server is another process's), `problem` says so:
  `/healthz` answers 503 with it, and the log says it once (and again when the reason
  changes). It is tried again every RESTORE_RETRY seconds.

Nothing here blocks the event loop: every file, lock, process and PING goes through
`asyncio.to_thread`, and the server is talked to with the asyncio client
(tests/test_embedded.py checks both).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import time

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import ResponseError as RedisResponseError

from engine.store.embedded import PIDFILE_NAME, EmbeddedRedis, EmbeddedRedisError

SUPERVISE_POLL = 0.1  # seconds between two liveness checks
RESTART_BACKOFF = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # before restart 1, 2, ...; the last repeats
STABLE_AFTER = 30.0  # a server up this long starts the backoff over
RESTORE_RETRY = 1.0  # seconds between two tries to make a vanished folder again
REWRITE_TIMEOUT = 120.0  # for the AOF rewrite from memory

log = logging.getLogger("subs.embedded")


class _Unrestorable(Exception):
    """Why the folder cannot be made again (yet): said on /healthz and in the log."""


class Supervisor:
    """Watches one EmbeddedRedis; `problem` is None, or why the store is not durable now.

    `problem` is meant for anyone (/healthz): a few words, never a path.
    """

    def __init__(self, server: EmbeddedRedis) -> None:
        self.server = server
        self.problem: str | None = None
        self._control: Redis | None = None  # held open: the socket file may vanish
        self._lock_fd: int | None = None  # the made-again folder's pidfile lock, until handed on
        self._said: str | None = None

    async def run(self) -> None:
        """Until cancelled."""
        restarts = 0
        up_since = time.monotonic()
        me = asyncio.current_task()
        try:
            await self._hold_control()
            while True:
                if me is not None and me.cancelling():
                    # A cancel that lands in a redis-py command (the PING that opens
                    # the control connection) can be swallowed: the command completes.
                    raise asyncio.CancelledError
                await asyncio.sleep(SUPERVISE_POLL)
                state = await asyncio.to_thread(self.server.state)
                if state == "running":
                    self._clear()
                    await self._hold_control()
                    continue
                if state == "moved":
                    await self._restore()
                    continue
                how = await asyncio.to_thread(self.server.ended)
                await self._drop_control()
                if time.monotonic() - up_since >= STABLE_AFTER:
                    restarts = 0
                restarts, delay = await self._restart(how, restarts)
                up_since = time.monotonic()
                await self._hold_control()
                self._clear()
                now = (
                    f"restarted it as pid {self.server.pid}"
                    if self.server.owned
                    else "another subs restarted it"
                )
                log.warning(
                    "the embedded redis-server died (%s): %s on %s with the AOF in %s "
                    "(restart %d, after %.1f s backoff)",
                    how,
                    now,
                    self.server.socket_path,
                    self.server.data_dir,
                    restarts,
                    delay,
                )
        finally:
            await self._drop_control()
            self._let_go()

    async def _restart(self, how: str, restarts: int) -> tuple[int, float]:
        """Start the dead server again, backing off; the restarts so far and the last delay."""
        while True:
            delay = RESTART_BACKOFF[min(restarts, len(RESTART_BACKOFF) - 1)]
            restarts += 1
            await asyncio.sleep(delay)
            try:
                await asyncio.to_thread(self.server.start)
            except (EmbeddedRedisError, OSError) as err:
                log.warning(
                    "the embedded redis-server (%s) could not be restarted (try %d): %s",
                    how,
                    restarts,
                    err,
                )
                continue
            return restarts, delay

    async def _restore(self) -> None:
        """The folder is gone and the server lives: make the folder again from its memory."""
        server = self.server
        try:
            if not server.owned:
                raise _Unrestorable(
                    "its data folder was removed under another process's redis-server"
                )
            if self._control is None:
                raise _Unrestorable(
                    "its data folder was removed, and the server cannot be reached to "
                    "write it again"
                )
            if self._lock_fd is not None and not await asyncio.to_thread(
                _locks, self._lock_fd, server
            ):
                self._let_go()  # the folder we made was removed too
            if self._lock_fd is None:
                self._lock_fd = await asyncio.to_thread(_make_folder, server)
            self._complain("its data folder was removed; writing it again from memory")
            await _rewrite_into(self._control, str(server.data_dir))
            await self._drop_control()  # the restart ends it
            old = server.pid
            try:
                await asyncio.to_thread(server.restart_holding, self._lock_fd)
                await self._hold_control()
            except (EmbeddedRedisError, OSError) as err:
                # It stopped, its AOF flushed into the new folder: a plain restart follows.
                # Our copy of the folder's lock goes first, or our own probe of the folder
                # would read it as a server running there.
                self._let_go()
                raise _Unrestorable(
                    f"its data folder was written again, but the server did not start on it ({err})"
                ) from None
        except _Unrestorable as why:
            self._complain(str(why))
            await asyncio.sleep(RESTORE_RETRY)
            return
        self._clear()
        log.warning(
            "the embedded Redis's folder %s was removed under it: made it again, wrote "
            "the live server's data there and restarted it on it (pid %s, was pid %s); "
            "nothing is lost",
            server.data_dir,
            server.pid,
            old,
        )

    def _complain(self, problem: str) -> None:
        """Set `problem`; log it when it is new."""
        self.problem = problem
        if problem != self._said:
            self._said = problem
            log.warning("the embedded redis-server on %s: %s", self.server.data_dir, problem)

    def _clear(self) -> None:
        self.problem = self._said = None
        self._let_go()

    def _let_go(self) -> None:
        """Close our copy of a made-again folder's lock (the server holds its own)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    async def _hold_control(self) -> None:
        """A connection to our own server, opened as soon as it runs: once the socket
        file is removed it is the only way in."""
        if self._control is not None or not self.server.owned:
            return
        control = Redis(
            unix_socket_path=str(self.server.socket_path),
            single_connection_client=True,
            socket_timeout=5,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            await control.ping()
        except (RedisError, OSError):
            await control.aclose()
            return
        except BaseException:  # cancelled mid-PING (subs stopping): close it, or it leaks
            await asyncio.shield(control.aclose())
            raise
        self._control = control

    async def _drop_control(self) -> None:
        control, self._control = self._control, None
        if control is not None:
            with contextlib.suppress(RedisError, OSError):
                await control.aclose()


def _make_folder(server: EmbeddedRedis) -> int:
    """Make the data folder again, holding a new pidfile lock (returned) from the moment
    it appears: it is built aside and renamed into place, so no other `subs` can find
    it without a lock and start an empty server there."""
    aside = server.data_dir.with_name(f"{server.data_dir.name}.remade-{os.getpid()}")
    try:
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir(mode=0o700)
        fd = os.open(aside / PIDFILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        raise _Unrestorable(
            f"its data folder was removed and cannot be made again ({err.strerror or err})"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(aside, server.data_dir)  # atomic; onto nothing, or an empty folder
    except OSError as err:
        os.close(fd)
        shutil.rmtree(aside, ignore_errors=True)
        raise _Unrestorable(
            "its data folder was removed and something else is at its path now "
            f"({err.strerror or err})"
        ) from None
    return fd


def _locks(fd: int, server: EmbeddedRedis) -> bool:
    """Whether `fd` is the pidfile now at the data folder's path."""
    try:
        here = server.pidfile.stat()
    except OSError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


async def _rewrite_into(control: Redis, folder: str) -> None:
    """Have the server write its whole dataset as a new AOF in `folder` (its new dir)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REWRITE_TIMEOUT
    try:
        await control.config_set("dir", folder)
        while True:
            await _rewrite_done(control, deadline)  # one that began before is no use
            try:
                await control.bgrewriteaof()
            except RedisResponseError as err:
                if "in progress" not in str(err):
                    raise
                continue
            break
        status = await _rewrite_done(control, deadline)
    except (RedisError, OSError) as err:
        raise _Unrestorable(
            f"its data folder was removed, and writing it again failed ({err})"
        ) from None
    if status != "ok":
        raise _Unrestorable(
            f"its data folder was removed, and writing it again failed (rewrite {status})"
        )


async def _rewrite_done(control: Redis, deadline: float) -> str:
    """Wait out the AOF rewrite under way (or scheduled); how the last one ended."""
    loop = asyncio.get_running_loop()
    while True:
        info = await control.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            return str(info.get("aof_last_bgrewrite_status", "ok"))
        if loop.time() > deadline:
            raise _Unrestorable(
                f"its data folder was removed, and writing it again took over {REWRITE_TIMEOUT:g} s"
            )
        await asyncio.sleep(0.05)
