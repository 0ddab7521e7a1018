"""The chat page (`/console/chat/{agent}`): a page on the AG-UI channel for each agent
this server runs, its files read once from the package (`engine/console/chat/`). An
address naming no agent, or one the server does not run, gets an HTML page saying so
and linking each agent's chat: a person typed it into a browser, not a client.

Every answer here carries the page's own CSP, stricter than the console's.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from importlib import resources
from urllib.parse import quote

from aiohttp import web

from engine.api.errors import ApiError
from engine.api.state import API

# The files the page may load, with their types; nothing else under chat/ is served.
_ASSETS = {
    "chat.js": "text/javascript",
    "agui.js": "text/javascript",
    "chat.css": "text/css",
}
# The page runs only its own files: no inline script or style, no other origin.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, bytes]:
    folder = resources.files("engine.console").joinpath("chat")
    return {name: folder.joinpath(name).read_bytes() for name in ("index.html", *_ASSETS)}


_FILES = _load()


def _answer(body: bytes | str, content_type: str, status: int = 200) -> web.Response:
    data = body.encode() if isinstance(body, str) else body
    return web.Response(
        body=data, status=status, content_type=content_type, charset="utf-8", headers=PAGE_HEADERS
    )


def chat_href(agent: str) -> str:
    """The chat page of an agent, its id quoted for a URL path."""
    return f"/console/chat/{quote(agent, safe='')}"


def missing_page(title: str, detail: str, agents: Sequence[str]) -> str:
    """The page for an address with no chat behind it: what is wrong, then the agents
    there are (escaped text and links only, under the same CSP as the chat page)."""
    if agents:
        items = "\n".join(
            f'<li><a href="{escape(chat_href(a))}">{escape(a)}</a></li>' for a in agents
        )
        listing = f'<h2>Agents on this server</h2>\n<ul id="agents">\n{items}\n</ul>'
    else:
        listing = (
            '<p id="agents">This server runs no agents: declare one in subs.toml '
            "(<code>[agent.&lt;id&gt;]</code>) and restart <code>subs serve</code>.</p>"
        )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · subs chat</title>
<link rel="stylesheet" href="/console/chat/assets/chat.css">
</head>
<body>
<header>
  <h1>subs chat</h1>
  <nav><a id="to-console" href="/console">console</a></nav>
</header>
<main id="missing">
<h2 id="problem">{escape(title)}</h2>
<p id="detail">{escape(detail)}</p>
{listing}
</main>
</body>
</html>
"""


async def get_chat_page(request: web.Request) -> web.Response:
    """The chat page for one agent (its script reads which from the path)."""
    agent = request.match_info["agent_id"]
    agents = request.app[API].agents
    if not agent:
        return await get_chat_index(request)
    if agent in agents:
        return _answer(_FILES["index.html"], "text/html")
    detail = f"This server runs no agent {agent!r}, so there is no chat with it."
    page = missing_page(f"No agent named {agent!r}", detail, agents)
    return _answer(page, "text/html", status=404)


async def get_chat_index(request: web.Request) -> web.Response:
    """`/console/chat` names no agent: the agents to pick from."""
    detail = "The chat page talks to one agent, named in its address: /console/chat/<agent>."
    page = missing_page("Which agent?", detail, request.app[API].agents)
    return _answer(page, "text/html")


async def get_chat_asset(request: web.Request) -> web.Response:
    """One of the chat page's own files; any other name is a 404."""
    name = request.match_info["name"]
    content_type = _ASSETS.get(name)
    if content_type is None:
        raise ApiError(f"no chat page file {name!r}", status=404, code="not_found")
    return _answer(_FILES[name], content_type)


def add_chat_routes(router: web.UrlDispatcher) -> None:
    """Mount the chat page; the API app calls this with the console's routes."""
    router.add_get("/console/chat", get_chat_index)
    router.add_get("/console/chat/assets/{name}", get_chat_asset)
    router.add_get("/console/chat/{agent_id:[^/]*}", get_chat_page)  # empty: as above
