"""The table of call kinds a subs engine runs by: the built-in kinds, subagents', MCP's.

Built afresh by each call, for the composition root (engine/runtime/engine.py), for
config's check of tool handlers and for the pure machine's tests; a caller with a kind
of its own adds it to this table (`Kinds.adding`) and hands that on.
"""

from __future__ import annotations

from . import connectors, kinds, subagents
from .core import Kinds


def default_kinds() -> Kinds:
    """The built-in kinds (kinds.py), the subagent call's (subagents.py) and the MCP
    connector's (connectors.py)."""
    return Kinds([*kinds.BUILTIN, subagents.KIND, *connectors.KINDS])
