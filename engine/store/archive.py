"""A session taken out of Redis and kept in a file: the archive format (docs/archive.md).

One gzip-compressed JSON-lines file per session: a header line naming the format and
its version, then the session's log, one event envelope a line, seq 1 to n. The log is
the session (its snapshot is a cache of the fold), so an archive holds only the log,
and a restore folds it again. A file is written beside its final name, fsynced, renamed
and its folder fsynced: a crash leaves the old file or the whole new one, never half.
"""

from __future__ import annotations

import base64
import gzip
import io
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from engine.errors import SubsError
from engine.jsonedge import encode

FORMAT = "subs.session-archive"
VERSION = 1


class ArchiveError(SubsError):
    """A file that is not a session archive this version can read, and why."""


@dataclass(frozen=True)
class Archive:
    """A session's log as an archive holds it, with the header's facts."""

    session_id: str
    events: list[dict[str, Any]]
    last_activity_ms: int
    written_ms: int
    files: dict[str, bytes] = field(default_factory=dict)  # the session's files, by digest

    @property
    def seq(self) -> int:
        """The last event's seq: a log's seqs run from 1 without gaps."""
        return len(self.events)


def file_name(session_id: str, last_activity_ms: int) -> str:
    """`<date of last activity, UTC>/<session id>.jsonl.gz`: `ls archive/*/ses_…*` finds a
    session by id, a day's folder by date. The id is %-quoted where a file name could not
    hold it (a `/`)."""
    day = datetime.fromtimestamp(last_activity_ms / 1000, UTC).strftime("%Y-%m-%d")
    return f"{day}/{export_name(session_id)}"


def export_name(session_id: str) -> str:
    """`subs sessions export`'s default file name: `<session id>.jsonl.gz`."""
    return f"{quote(session_id, safe='-_.~:')}.jsonl.gz"


def dumps(archive: Archive) -> bytes:
    """The file's bytes (gzip with no timestamp: one archive, one byte string)."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "session_id": archive.session_id,
        "seq": archive.seq,
        "last_activity_ms": archive.last_activity_ms,
        "written_ms": archive.written_ms,
        "files": len(archive.files),
    }
    lines = [encode(header), *(encode(e) for e in archive.events)]
    lines += [
        encode({"file": name, "base64": base64.b64encode(data).decode()})
        for name, data in sorted(archive.files.items())
    ]
    return gzip.compress(b"\n".join(lines) + b"\n", compresslevel=6, mtime=0)


def loads(data: bytes, where: str = "archive") -> Archive:
    """An archive's bytes, checked: its format and version, one session, seqs 1..n."""
    try:
        text = gzip.decompress(data)
    except (OSError, EOFError) as err:
        raise ArchiveError(f"{where}: not a gzip file ({err})") from None
    lines = [line for line in io.BytesIO(text).read().split(b"\n") if line.strip()]
    if not lines:
        raise ArchiveError(f"{where}: empty")
    try:
        header = orjson.loads(lines[0])
        rows = [orjson.loads(line) for line in lines[1:]]
    except orjson.JSONDecodeError as err:
        raise ArchiveError(f"{where}: a line is not JSON ({err})") from None
    n = 0  # the log's lines come first, then the files'
    while n < len(rows) and not (isinstance(rows[n], dict) and "file" in rows[n]):
        n += 1
    events = rows[:n]
    files: dict[str, bytes] = {}
    for r in rows[n:]:
        if not (isinstance(r, dict) and isinstance(r.get("file"), str)):
            raise ArchiveError(f"{where}: a line after the files began is not a file")
        try:
            files[r["file"]] = base64.b64decode(r.get("base64") or "", validate=True)
        except ValueError:
            raise ArchiveError(f"{where}: file {r['file']} is not base64") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ArchiveError(f"{where}: not a session archive (its first line names no {FORMAT!r})")
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise ArchiveError(
            f"{where}: archive version {version!r}; this subs reads versions 1 to {VERSION}"
        )
    sid = header.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise ArchiveError(f"{where}: the header names no session_id")
    for n, event in enumerate(events, 1):
        if not isinstance(event, dict) or event.get("seq") != n or event.get("session_id") != sid:
            raise ArchiveError(f"{where}: line {n + 1} is not event {n} of session {sid}")
    if header.get("files", 0) != len(files):
        raise ArchiveError(f"{where}: the header says {header.get('files', 0)} files")
    if header.get("seq") != len(events):
        raise ArchiveError(
            f"{where}: the header says {header.get('seq')} events, it holds {len(events)}"
        )
    return Archive(
        sid,
        events,
        int(header.get("last_activity_ms") or 0),
        int(header.get("written_ms") or 0),
        files,
    )


def write(path: Path, archive: Archive) -> Path:
    """Write the archive at `path` durably (the delete that follows depends on it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = dumps(archive)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def write_many(items: list[tuple[Path, Archive]]) -> None:
    """Write a batch of archives durably with one `sync(2)` for all of them (fsyncing
    each file and folder cost ~20 ms a session here: the sweep ran at ~50 sessions/s)."""
    for path, archive in items:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(dumps(archive))
        os.replace(tmp, path)
    if items:
        os.sync()  # Linux waits for the writeback: the files and their renames are on disk


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> Archive:
    """The archive in the file at `path`; ArchiveError naming what is wrong with it."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ArchiveError(f"cannot read {path}: {err.strerror or err}") from None
    return loads(data, str(path))
