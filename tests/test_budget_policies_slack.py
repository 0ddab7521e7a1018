"""A per-user `[[budgets]]` policy over Slack (issue #28 item 2): `subs serve` as a process,
the fake Slack through Bolt (HTTP events), the fake vendor. One person who has spent their
bucket is refused with the reason in the thread; another is still answered."""

from __future__ import annotations

from pathlib import Path

from engine.store.buckets import INDEX
from tests.engine_helpers import poll_until
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.slack_serve_helpers import of_type, slack_serve

# One answer of 400 words spends a 300-token bucket (the fake vendor counts a word an output
# token), while a first call's input (characters / 4) fits in it.
LONG = "word " * 400
PER_USER = """
[[budgets]]
name = "per-user"
group_by = ["user"]
dimension = "total_tokens"
limit = 300
window = "1h"
"""


async def test_a_per_user_policy_over_slack_stops_that_person_only(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> None:
    vendor.default = Text(LONG)
    async with slack_serve(tmp_path, redis_url, vendor.url, extra=PER_USER) as app:
        fake = app.fake
        alice, bob = fake.user, fake.add_user("bob")

        first = fake.post_as_user(fake.general, fake.mention("is the db ok?"), user=alice)
        assert (await app.send_event(fake.event_for(first, kind="app_mention"))).status == 200
        log = await app.turns_ended(first)
        assert of_type(log, "turn.completed")
        # Her call's usage reaches her bucket a relay after the commit.
        await poll_until(lambda: app.redis.zcard(INDEX), 10, "alice's bucket charged")
        sent = len(vendor.requests)

        again = fake.post_as_user(fake.general, fake.mention("and the cache?"), user=alice)
        assert (await app.send_event(fake.event_for(again, kind="app_mention"))).status == 200
        log = await app.turns_ended(again)
        [failed] = of_type(log, "turn.failed")
        error = failed["error"]
        assert error["code"] == "budget_exceeded"
        assert error["detail"]["policy"] == "per-user"
        assert error["detail"]["group"] == f"user=slack:{alice.id}"
        assert error["detail"]["frees_at"]
        assert len(vendor.requests) == sent  # no call was made for her
        # The thread says why, in one line naming the policy and when it frees up.
        said = await fake.until(
            lambda: next((m.text for m in app.bot_messages(again) if "per-user" in m.text), None),
            10,
        )
        assert "budget" in said and "frees up at" in said

        # Bob's bucket is his own: he is answered.
        his = fake.post_as_user(fake.general, fake.mention("is the db ok?"), user=bob)
        assert (await app.send_event(fake.event_for(his, kind="app_mention"))).status == 200
        log = await app.turns_ended(his)
        assert of_type(log, "turn.completed")
        assert len(vendor.requests) == sent + 1

        # In a shared thread each person's turn counts toward their own bucket, not the
        # thread starter's: Carol, who has spent nothing, is checked against hers in Alice's
        # thread (and refused only because this call alone, Alice's long answer in its
        # input, would cross it); Alice is checked against her spent one in Bob's thread.
        carol = fake.add_user("carol")
        hers = fake.post_as_user(
            fake.general, fake.mention("what about replicas?"), user=carol, thread_ts=first.ts
        )
        assert (await app.send_event(fake.event_for(hers, kind="app_mention"))).status == 200
        log = await app.turns_ended(hers, count=2)
        [failed] = of_type(log, "turn.failed")
        assert failed["error"]["detail"]["group"] == f"user=slack:{carol.id}"
        assert failed["error"]["detail"]["spent"] == "0"
        assert int(failed["error"]["detail"]["next"]) > 300
        said = await fake.until(
            lambda: next((m.text for m in app.bot_messages(hers) if "per-user" in m.text), None),
            10,
        )
        assert "more than the whole limit" in said and carol.id in said

        late = fake.post_as_user(
            fake.general, fake.mention("and the disk?"), user=alice, thread_ts=his.ts
        )
        assert (await app.send_event(fake.event_for(late, kind="app_mention"))).status == 200
        log = await app.turns_ended(late, count=2)
        [failed] = of_type(log, "turn.failed")
        assert failed["error"]["detail"]["group"] == f"user=slack:{alice.id}"
        assert int(failed["error"]["detail"]["spent"]) > 300
        said = await fake.until(
            lambda: next((m.text for m in app.bot_messages(late) if "per-user" in m.text), None),
            10,
        )
        assert alice.id in said and "frees up at" in said
        assert len(vendor.requests) == sent + 1
