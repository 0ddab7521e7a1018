"""Connectors (MCP): the tools a session draws from its agent's `[mcp.*]` connections.

A connection's tool list is a fact of the session's log, not of the engine process:
every turn of an agent that names connections starts with a sync of each one (a
`connector` call, run by the engine under the `connector` retry policy), which the
shell answers from its cache unless the server said its list changed; the list is
recorded (`connector.synced`) and the turn's first decision waits for it
(`decision.held` ... `decision.released`). The model then sees the surviving tools as
`<prefix>__<tool>`, and a call to one runs on the engine (handler `server`).

A connection that cannot start on this engine (`Project.connections_off`: its program
is not installed, a variable its command names is unset) answers its sync as `off`, with
the reason: recorded once, as a note, while it stays off; the turn runs without it.

A sync that fails for want of a credential stops the turn with an interrupt naming the
connection (`auth_failure = "interrupt"`, the default), and resuming it syncs again; with
`"degrade"`, or for any other failure, the turn goes on without those tools.

What the agent names and the tools it is offered, read, are connections.py's; the two
call kinds (`KINDS`) are how the call rules run a sync and a call.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from . import kinds
from .asking import decide
from .calls import call_failed, dispatch
from .connections import connector_interrupt, entries
from .core import CallKind, Step
from .effects import RunCall
from .inputs import CallAnswered
from .interrupts import raise_interrupt
from .settling import settle_tool
from .shapes import Answer, ClientAction, ClientMessages, ErrorInfo, Synced
from .state import Call

AUTH = "unauthorized"  # `detail.reason` of a sync or call refused for its credential


class RunConnectorSync(RunCall):
    """Fetch the tool list of connection `calls[call_id].name` (`mcp.<id>`)."""


class RunMcpCall(RunCall):
    """Call a connector tool on its server (the call's `params` say which)."""


# -- syncing at a turn's start ---------------------------------------------------------


def hold(
    st: Step,
    agent: dict[str, Any] | None,
    trigger: ClientMessages | ClientAction,
    proposed: Answer,
    *,
    force: str | None = None,
) -> bool:
    """Sync the agent's connections before the turn's first decision; True if it waits.
    `force` is a connection to fetch from its server rather than the engine's cache."""
    paths = [e["id"] for e in entries(agent)]
    if not paths:
        return False
    st.emit({"type": ev.DECISION_HELD, "trigger": trigger, "proposed": proposed})
    for path in paths:
        start_sync(st, path, force=path == force, agent=agent)
    return True


def start_sync(st: Step, path: str, *, force: bool, agent: dict[str, Any] | None = None) -> None:
    """A `connector` call for one connection (one at a time per connection)."""
    if any(c.kind == "connector" and c.name == path for c in st.s.calls.values()):
        return
    call_id = st.ids("sync")
    requested: ev.ConnectorSyncRequested = {
        "type": ev.CONNECTOR_SYNC_REQUESTED,
        "id": call_id,
        "name": path,
        "handler": "server",
        "retry": st.kinds.policy("connector", agent or st.s.agent),
    }
    if force:
        requested["params"] = {"force": True}
    st.emit(requested)
    dispatch(st, st.s.calls[call_id], 1)


def settle_sync(st: Step, call: Call, inp: CallAnswered) -> None:
    """The runner's answer: the list (recorded), an `off` connection (recorded as such,
    with no tools: an answer, not a failed attempt), or a failed attempt."""
    if inp.error is not None:
        call_failed(st, call, inp.error, inp.retryable, inp.retry_after)
        return
    listed = inp.result if isinstance(inp.result, dict) else {}
    path, off, prefix = call.name or "", listed.get("off"), listed.get("prefix")
    tools = [] if off else list(listed.get("tools") or ())
    timeout = listed.get("approve_timeout_ms")
    timeout = timeout if isinstance(timeout, int) and timeout > 0 else None
    now: Synced = {"tools": tools}
    if prefix:
        now["prefix"] = prefix
    if off:
        now["off"] = off
    if timeout:
        now["approve_timeout_ms"] = timeout
    synced: ev.ConnectorSynced = {"type": ev.CONNECTOR_SYNCED, "id": call.id, "path": path}
    if st.s.connectors.get(path) != now:  # recorded when it changes: a turn adds no list
        synced["tools"] = tools
        if prefix:
            synced["prefix"] = prefix
        if off:
            synced["off"] = off
        if timeout:
            synced["approve_timeout_ms"] = timeout
    st.emit(synced)
    release(st)


def sync_failed(st: Step, call: Call, error: ErrorInfo) -> None:
    """A sync failed for good (its `errored` event is recorded): ask for the credential,
    or go on without the connection's tools."""
    path = call.name or ""
    entry = next((e for e in entries(st.s.agent) if e["id"] == path), {})
    unauthorized = (error.get("detail") or {}).get("reason") == AUTH
    if unauthorized and entry.get("auth_failure", "interrupt") == "interrupt":
        raise_interrupt(
            st,
            {
                "reason": f"{path} needs authorizing: {error['message']}",
                "payload": {
                    "message": f"The connection **{path}** refused its credential. "
                    "Fix the secret, then retry: it is fetched again and the turn goes on.",
                    # Slack shows the option as a Retry button (bot/rendering/prompts.py).
                    "metadata": {
                        "connector": path,
                        "options": [{"label": "Retry", "value": "retry", "style": "primary"}],
                    },
                },
            },
            "engine",
        )
        return
    release(st)


def release(st: Step) -> None:
    """The held decision goes once no sync is open and no connection waits for a person."""
    s = st.s
    if s.held is None or s.turn is None:
        return
    if any(c.kind == "connector" for c in s.calls.values()) or connector_interrupt(s):
        return
    held = s.held
    st.emit({"type": ev.DECISION_RELEASED})
    decide(st, held["trigger"], held["proposed"])


# -- the calls ---------------------------------------------------------------------------


def settle_call(st: Step, call: Call, inp: CallAnswered) -> None:
    """A connector tool's answer is its MCP result as recorded (isError included)."""
    if inp.error is not None:
        call_failed(st, call, inp.error, inp.retryable, inp.retry_after)
    else:
        settle_tool(st, call, inp.result, None, False)


# The connector's two kinds, for the table (defaults.py).
KINDS: tuple[CallKind, ...] = (
    CallKind(
        kind="tool",
        handler="server",
        retry="tool",
        runnable=kinds.always,
        effect=RunMcpCall,
        deadline=kinds.backstop(kinds.BACKSTOP_GRACE_MS),
        in_flight=True,  # MCP has no idempotency key: a lost call is sent again
        settle=settle_call,
    ),
    CallKind(
        kind="connector",
        handler="server",
        retry="connector",
        runnable=kinds.always,
        effect=RunConnectorSync,
        deadline=kinds.backstop(kinds.BACKSTOP_GRACE_MS),
        in_flight=True,
        settle=settle_sync,
        failed=sync_failed,
        # An attempt includes starting a stdio server, and `npx -y` fetches its package on
        # first use: a minute before it counts as failed.
        retry_defaults={
            "queue_timeout_secs": None,
            "run_timeout_secs": 60,
            "total_timeout_secs": 240,
            "max_attempts": 3,
            "backoff_base_secs": 1,
            "backoff_max_secs": 10,
        },
        agent_retry="connector",
    ),
)
