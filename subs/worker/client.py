"""Answering later: ending an async tool call, or a decision left unanswered.

A worker that answered `LATER` finishes the work elsewhere (a queue, a human) and then
calls back into the engine's machine API with a full-access key:
`POST /api/machine/sessions/{id}/calls/settle` ends a tool call (docs/API.md), and
`POST /api/machine/workers/submit` answers a decision by its `decision_id`, in the
original engine's shape (its docs/250-api.md: `{session_id, decision_id, actions}`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from subs.worker.models import Action, DecisionResponse

__all__ = ["SubsApiError", "SubsClient"]

_UNSET: Any = object()


class SubsApiError(Exception):
    """The engine refused a call: its status and its JSON error body."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else body
        super().__init__(f"{status}: {error}")
        self.status = status
        self.body = body


class SubsClient:
    """The machine API calls a worker needs; `async with SubsClient(url, key) as c:`."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SubsClient:
        self._http = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def settle(
        self,
        session_id: str,
        call_id: str,
        *,
        result: Any = _UNSET,
        error: str | None = None,
        retryable: bool | None = None,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """End an open tool call with its `result`, or as failed with `error`."""
        if (result is _UNSET) == (error is None):
            raise ValueError("settle takes a result or an error, not both and not neither")
        body: dict[str, Any] = {"id": call_id}
        if error is None:
            body["result"] = result
        else:
            body["error"] = error
            if retryable is not None:
                body["retryable"] = retryable
        if attempt is not None:
            body["attempt"] = attempt
        return await self._post(
            f"/api/machine/sessions/{quote(session_id, safe='')}/calls/settle", body
        )

    async def submit_decision(
        self,
        session_id: str,
        decision_id: str,
        actions: list[Action] | DecisionResponse,
    ) -> dict[str, Any]:
        """Answer a decision the worker answered `LATER`. With no trigger to fill in
        defaults, an action that ends a call names its `id`, an `llm.call` its `model`."""
        if isinstance(actions, DecisionResponse):
            actions = list(actions.actions or [])
        wire = DecisionResponse(actions=actions).to_wire()["actions"]
        body = {"session_id": session_id, "decision_id": decision_id, "actions": wire}
        return await self._post("/api/machine/workers/submit", body)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._http is None:
            raise RuntimeError("use the client as `async with SubsClient(...) as client`")
        async with self._http.post(self.base_url + path, json=body) as response:
            try:
                answer = await response.json(content_type=None)
            except ValueError:
                answer = await response.text()
            if not 200 <= response.status < 300:
                raise SubsApiError(response.status, answer)
            return answer if isinstance(answer, dict) else {"body": answer}
