"""How a connection reaches its server: the SDK transport an `[mcp.<id>]` block declares,
a stdio child it starts (`command`) or a streamable HTTP endpoint (`url`).

Two traps of the SDK (README "MCP"): a stdio child gets almost none of our environment
(only `env` and `env_from` reach it), and an HTTP 401/403 comes back from the SDK as a
generic JSON-RPC error, so the status is caught by an httpx2 response hook first (the
connection's `Witness` keeps it, trouble.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

from engine.config import McpBlock
from engine.effects.mcp.trouble import Witness


def server_transport(
    block: McpBlock, env: Mapping[str, str], base_dir: str, stack: AsyncExitStack, witness: Witness
) -> Any:
    """The SDK's transport to the server `block` declares, not yet entered; what it opens
    besides (a stdio child's stderr pipe, the HTTP client) closes with `stack`."""
    import httpx2
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if block.command:
        child_env = dict(block.env)
        for name in block.env_from:
            if env.get(name):
                child_env[name] = env[name]
        argv, cwd = block.argv(env), block.workdir(env, base_dir)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env, cwd=cwd)
        return stdio_client(params, errlog=witness.stderr(stack))
    headers: dict[str, str] = {}
    if block.token_env:
        token = env.get(block.token_env) or ""
        if block.header:
            headers[block.header] = token
        else:
            headers["Authorization"] = f"Bearer {token}"
    client = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [witness.saw_response]},
    )
    stack.push_async_callback(client.aclose)
    assert block.url is not None
    return streamable_http_client(block.url, http_client=client)
