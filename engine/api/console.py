"""The operator console's files (`/console`): one page and its ES modules, read from the
package (no CDN, no build step). The page holds no data and needs no key: its scripts ask
for one when the API says 401, then call the API itself. Answers carry the strict CSP set
in `middleware.console_headers`."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from engine.api.errors import ApiError

# The files the page may load, with their types; nothing else under static/ is served.
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _load() -> dict[str, tuple[bytes, str]]:
    """Every static file, read once: a page an on-call engineer reloads must not touch disk."""
    files: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("engine.console").joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


_FILES = _load()


def _file(name: str) -> web.Response:
    found = _FILES.get(name)
    if found is None:
        raise ApiError(f"the console has no file {name!r}", status=404, code="not_found")
    body, kind = found
    return web.Response(body=body, headers={"Content-Type": kind, "Cache-Control": "no-cache"})


async def console_page(request: web.Request) -> web.Response:
    """The page for `/console` and `/console/sessions/{sid}`: its script reads the path."""
    return _file("index.html")


async def console_static(request: web.Request) -> web.Response:
    """One of the console's static files."""
    return _file(request.match_info["name"])


def add_console_routes(router: web.UrlDispatcher) -> None:
    """Mount the operator console; the API app calls this once."""
    router.add_get("/console", console_page)
    router.add_get("/console/sessions/{sid}", console_page)
    router.add_get("/console/static/{name}", console_static)
