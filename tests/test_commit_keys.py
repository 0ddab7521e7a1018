"""The commit script's keys, kept per session (engine/store/log.py `commit_keys`): the same
names the key methods give, for every session and partition, and never more than
COMMIT_KEYS_KEPT sessions' kept."""

from __future__ import annotations

from engine.store import log
from engine.store.keys import spread_tags
from engine.store.store import Store


def _built(store: Store, sid: str, p: int, scopes: tuple[str, ...] | None) -> tuple[str, ...]:
    """The keys as each commit built them before they were kept."""
    keys = [
        store.log_key(sid),
        store.snap_key(sid),
        store.work_key(p),
        store.inflight_key(p),
        store.lease_key(p),
        store.timers_key(p),
        store.reply_key(sid, "none"),
        store.outbox_key(p),
        store.sessions_key(p),
        store.dead_key(p),
    ]
    if scopes is not None:
        keys += [store.moves_key(p), store.mark_key(p), *store.index_keys(sid, scopes)]
    return tuple(keys)


async def test_kept_keys_are_the_ones_built_afresh_and_bounded(redis, monkeypatch) -> None:
    monkeypatch.setattr(log, "COMMIT_KEYS_KEPT", 50)
    store = Store(redis, 16, tags=spread_tags(16))
    scopes = ("t", "a:ops:t")
    for round_ in range(2):  # the second round reads what the first kept (or made again)
        for n in range(120):
            sid = f"ses-{n}"
            p = store.partition_of(sid)
            for each in (None, scopes, ("s", "a:ops:s")):
                assert store.commit_keys(sid, p, each) == _built(store, sid, p, each), (round_, n)
            assert len(store._commit_keys) <= 50
