"""A work item's body as the machine's input, with what the project file says of its agent.

Inputs are stored in their wire form (`input_to_json`). Most come back as they were
sent; the two that may create a session (a client's input, a spawned child's first)
are completed here with the agent as `subs.toml` declares it: its wire config (with
its model's prices, which budgets need), who decides for it, the LLM routes, its
Slack commands. A client's input naming no declared agent is refused here, with the
agents there are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.config import Project
from engine.effects.llm.prices import with_prices
from engine.machine import (
    ChildSpawned,
    ClientSubmitted,
    Input,
    MachineError,
    SessionState,
    input_from_json,
)


class Intake:
    """Turns stored inputs into machine inputs for one project's agents."""

    def __init__(self, project: Project) -> None:
        self.project = project
        # Built once: the machine only reads these (events carry them by reference).
        # An agent's budget carries its model's price (the machine estimates a call with it).
        self.agent_configs = {
            a.id: with_prices(project, a.wire_config(project), a) for a in project.agents.values()
        }
        self.llm_routes = {b.id: {"type": b.type, "format": b.format} for b in project.llm.values()}

    def input_of(self, state: SessionState | None, body: dict[str, Any]) -> Input:
        """The machine input a work item's body holds, for the session in `state`.

        Raises:
            MachineError: a client's first input names an agent the project lacks.
        """
        if body.get("kind") != "client":
            inp = input_from_json(body)
            if isinstance(inp, ChildSpawned):
                # A child starts with its agent's file config, like a client's first input.
                return dataclasses.replace(
                    inp,
                    agent_config=self.agent_configs.get(inp.agent_id),
                    decider=self._decider(inp.agent_id),
                    llm_routes=self.llm_routes,
                )
            return inp
        inp = body["input"]
        agent_id = inp.get("agent_id") or (state.agent_id if state else "")
        decl = self.project.agents.get(agent_id)
        if decl is None and state is None:
            raise MachineError(
                f"no agent {agent_id!r} in {self.project.path}; "
                f"declared: {', '.join(sorted(self.project.agents)) or 'none'}",
                code="unknown_agent",
                status=404,
            )
        config = self.agent_configs.get(agent_id)
        decider = self._decider(agent_id)
        identity = body.get("identity") or {}
        commands = tuple(decl.slack.commands) if decl and decl.slack else ()
        return ClientSubmitted(
            inp,
            agent_id,
            identity,
            config,
            decider,
            self.llm_routes,
            owner=body.get("owner"),
            slash_commands=commands,
            traceparent=body.get("traceparent"),
            tracestate=body.get("tracestate"),
        )

    def _decider(self, agent_id: str) -> str:
        """Who decides for an agent: its worker when it names one, else the engine."""
        decl = self.project.agents.get(agent_id)
        return "worker" if decl and decl.worker else "engine"
