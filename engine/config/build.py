"""The build from the checked file to the engine's model: defaults filled in, durations
and prices in the units the engine computes with."""

from __future__ import annotations

from pathlib import Path

from engine.config.budgets import build as build_budgets
from engine.config.checks import mcp_refs
from engine.config.model import (
    LLM_DEFAULTS,
    AgentDecl,
    AlertmanagerHookConfig,
    LlmBlock,
    McpBlock,
    Project,
    ServeConfig,
    SlackBlock,
    StoreConfig,
    TelemetryConfig,
    WatchEntry,
    duration_ms,
)
from engine.config.schema import Root, _Price


def _price_strings(p: _Price) -> dict[str, str]:
    """A block's price as decimal strings (the cost arithmetic is Decimal, never float)."""
    read = p.input if p.cache_read is None else p.cache_read
    write = p.input if p.cache_write is None else p.cache_write
    values = {"input": p.input, "output": p.output, "cache_read": read, "cache_write": write}
    return {k: repr(float(v)) for k, v in values.items()}


def build(root: Root, path: str) -> Project:
    """The Project a checked file declares; `path` is the file's absolute path."""
    llm = {
        lid: LlmBlock(
            id=lid,
            type=b.type,
            api_key_env=None
            if b.auth == "none"
            else b.api_key_env or LLM_DEFAULTS.get(b.type, (None, None))[0],
            base_url=b.base_url or LLM_DEFAULTS.get(b.type, (None, None))[1],
            format=b.format,
            cache=b.cache,
            prices={m: _price_strings(p) for m, p in b.prices.items()},
        )
        for lid, b in root.llm.items()
    }
    agents = {
        aid: AgentDecl(
            id=aid,
            llm=a.llm,
            model=a.model,
            system=a.system,
            effort=a.effort,
            description=a.description,
            tools=tuple(t.model_dump(exclude_none=True) for t in a.tools),
            subagents=tuple(e.id.removeprefix("agent.") for e in a.subagents),
            max_subagent_depth=root.max_subagent_depth
            if a.max_subagent_depth is None
            else a.max_subagent_depth,
            worker=a.worker,
            signing_secret_env=a.signing_secret_env,
            retry=None if a.retry is None else a.retry.model_dump(exclude_none=True),
            mcp=tuple(mcp_refs(root, path, f"agent.{aid}", a)),
            subagent_modes={e.id.removeprefix("agent."): e.mode for e in a.subagents if e.mode},
            slack=None
            if a.slack is None
            else SlackBlock(
                name=a.slack.name or aid,
                description=a.slack.description,
                answers=a.slack.answers,
                commands=tuple(a.slack.commands),
                stream=a.slack.stream,
                max_concurrent_turns=a.slack.max_concurrent_turns,
                files=a.slack.files,
                file_text_limit=a.slack.file_text_limit,
                allow_teams=tuple(a.slack.allow.teams) if a.slack.allow else (),
                allow_channels=tuple(a.slack.allow.channels) if a.slack.allow else (),
                allow_users=tuple(a.slack.allow.users) if a.slack.allow else (),
                external=a.slack.external,
                follow=a.slack.follow,
                show_cost=a.slack.show_cost,
                watch=tuple(WatchEntry(w.channel, tuple(w.from_), w.match) for w in a.slack.watch),
            ),
            approvers=tuple(a.approvers or ()),
            budget=None if a.budget is None else a.budget.model_dump(exclude_none=True),
            session_budget=None
            if a.session_budget is None
            else a.session_budget.model_dump(exclude_none=True),
        )
        for aid, a in root.agent.items()
    }
    return Project(
        path=path,
        name=root.name or Path(path).parent.name or "subs",
        redis=root.redis,
        serve=ServeConfig(
            host=root.serve.host,
            port=root.serve.port,
            cors_origins=tuple(dict.fromkeys(root.serve.cors_origins)),
            max_streams_per_key=root.serve.max_streams_per_key,
            max_streams=root.serve.max_streams,
            public_url=root.serve.public_url,
            header_timeout_secs=root.serve.header_timeout_secs,
            state_cache_mb=root.serve.state_cache_mb,
            state_cache_sessions=root.serve.state_cache_sessions,
            client_token_issuer=root.serve.client_token_issuer,
            client_token_audience=root.serve.client_token_audience,
        ),
        llm=llm,
        agents=agents,
        store=StoreConfig(
            fsync=root.store.fsync,
            wait_replicas=root.store.wait_replicas,
            wait_timeout_ms=root.store.wait_timeout_ms,
            partitions=root.store.partitions,
            retention_ms=None
            if root.store.retention == "forever"
            else duration_ms(root.store.retention),
            archive_dir=None if root.store.archive == "none" else root.store.archive[4:].strip(),
            max_memory=root.store.max_memory,
        ),
        mcp={
            mid: McpBlock(
                id=mid,
                url=b.url,
                command=None if b.command is None else tuple(b.command),
                token_env=b.token_env,
                header=b.header,
                prefix_tools=b.prefix_tools,
                env=tuple(b.env.items()),
                env_from=tuple(b.env_from),
                cwd=b.cwd,
                approve_timeout_ms=duration_ms(b.approve_timeout),
            )
            for mid, b in root.mcp.items()
        },
        telemetry=TelemetryConfig(
            endpoint=root.telemetry.endpoint,
            service_name=root.telemetry.service_name,
            capture_content=root.telemetry.capture_content,
        ),
        alertmanager=None
        if root.hooks.alertmanager is None
        else AlertmanagerHookConfig(root.hooks.alertmanager.agent, root.hooks.alertmanager.channel),
        budgets=build_budgets(root.budgets),
    )
