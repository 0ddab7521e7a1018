"""The conversation tree: paths and how a client's view maps onto it (SPEC §10)."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from .state import Node


def path_to(nodes: dict[str, Node], node_id: str | None) -> list[dict[str, Any]]:
    """Messages root → `node_id`.

    A cycle cannot be recorded any more (ids are checked before they are), but a log an
    older version wrote may hold one: the walk stops where the path would repeat.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    while node_id is not None and node_id not in seen:
        seen.add(node_id)
        node = nodes[node_id]
        out.append(node.message)
        node_id = node.parent_id
    out.reverse()
    return out


@dataclass(frozen=True)
class ViewMatch:
    """How a full client view lines up with the tree.

    `known` is the node the matched prefix ends at (None: nothing matched);
    `new_from` is the index of the first message that is new or has no id.
    """

    known: str | None
    new_from: int


def match_view(nodes: dict[str, Node], view: list[dict[str, Any]]) -> ViewMatch:
    """Keep the known prefix by id; the first new or id-less message branches there."""
    parent: str | None = None
    for i, msg in enumerate(view):
        mid = msg.get("id")
        node = nodes.get(mid) if mid else None
        if node is None or node.parent_id != parent:
            return ViewMatch(known=parent, new_from=i)
        parent = mid
    return ViewMatch(known=parent, new_from=len(view))


def id_clash(drafts: list[dict[str, Any]], known: Container[str]) -> str | None:
    """Why these messages cannot be recorded as they are: an id already in the tree (or
    in `known`), or twice among them. Recording it would make the tree a cycle."""
    seen: set[str] = set()
    for i, draft in enumerate(drafts):
        mid = draft.get("id")
        if not mid:
            continue
        if mid in known:
            return f"messages.{i}.id: message {mid!r} is already recorded"
        if mid in seen:
            return f"messages.{i}.id: message {mid!r} appears twice"
        seen.add(mid)
    return None
