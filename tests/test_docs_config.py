"""docs/config.md is the whole of subs.toml, and every TOML snippet of the docs loads.

The page is held to the file model in engine/config/schema.py, walked recursively: every block
has a section, every key a row saying its type, default and allowed values, and no row
names a key the model lacks. Every ```toml block of README.md and docs/*.md parses; a
block whose first line is a `# subs.toml` comment is a whole file and loads as one (the
strict load: shape, secrets, the rules across keys); any other fits the file's shape.
The local-server example runs a turn on the fake vendor with no key.
"""

from __future__ import annotations

import re
import tomllib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from engine.config import load_project, parse_project
from engine.config.schema import Root  # the file's model: what subs.toml may hold
from engine.config.wording import from_pydantic
from engine.machine import default_kinds
from tests.engine_helpers import ROOT, subs
from tests.fakes.llm_vendor import FakeVendor, Text

CONFIG_MD = ROOT / "docs" / "config.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WHOLE = re.compile(r"# subs\.toml\b")


# --- the snippets ------------------------------------------------------------------------------


def toml_blocks() -> Iterator[tuple[str, str]]:
    """(where, text) of every ```toml block of the pages; where is `page:line`."""
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```toml\n(.*?)^```", text, re.M | re.S):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{page.relative_to(ROOT)}:{line}", match.group(1)


BLOCKS = list(toml_blocks())


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_every_toml_snippet_of_the_docs_loads(where: str, text: str) -> None:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AssertionError(f"{where}: not TOML: {e}") from None
    if WHOLE.match(text):
        parse_project(text, where, env={})
        return
    try:
        Root.model_validate(data)
    except ValidationError as e:
        raise AssertionError(f"{from_pydantic(where, e)}") from None


def test_the_docs_show_whole_files_and_the_examples_load() -> None:
    whole = [where for where, text in BLOCKS if WHOLE.match(text)]
    assert sum(w.startswith("docs/config.md") for w in whole) >= 3, whole
    for example in [ROOT / "subs.toml", *(ROOT / "docs" / "examples").glob("*.toml")]:
        load_project(example, env={})


# --- the model, walked -------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    block: str  # as the page heads its section: "[serve]", "[[agent.<id>.tools]]", "" (top)
    name: str
    annotation: Any  # the value's type, Optional and Annotated stripped
    default: Any  # PydanticUndefined: required


def _bare(annotation: Any) -> Any:
    """`X | None` and `Annotated[X, ...]` as X; a string-or-table union as the table."""
    if get_origin(annotation) is Annotated:
        return _bare(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        options = [_bare(a) for a in get_args(annotation) if a is not type(None)]
        return ([a for a in options if _is_table(a)] or options)[0]
    return annotation


def _is_table(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_table_list(annotation: Any) -> bool:
    return get_origin(annotation) is list and _is_table(_bare(get_args(annotation)[0]))


def walk(model: type[BaseModel], path: str = "", array: bool = False) -> Iterator[Key]:
    """Every key of the file, block by block."""
    block = "" if not path else f"[[{path}]]" if array else f"[{path}]"
    for attr, field in model.model_fields.items():
        name = field.alias or attr  # as the file spells it (`from`, a Python keyword)
        annotation = _bare(field.annotation)
        default = field.default
        if field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
        yield Key(block, name, annotation, default)
        inner = f"{path}.{name}" if path else name
        if _is_table(annotation):
            yield from walk(annotation, inner)
        elif _is_table_list(annotation):
            yield from walk(_bare(get_args(annotation)[0]), inner, array=True)
        elif get_origin(annotation) is dict and _is_table(_bare(get_args(annotation)[1])):
            yield from walk(_bare(get_args(annotation)[1]), f"{inner}.<id>")


KEYS = list(walk(Root))


def test_the_walk_reaches_every_block() -> None:
    """The walk itself, so the page test below checks what it should."""
    blocks = {k.block for k in KEYS}
    for block in (
        "",
        "[serve]",
        "[store]",
        "[llm.<id>]",
        "[agent.<id>]",
        "[[agent.<id>.tools]]",
        "[[agent.<id>.subagents]]",
        "[agent.<id>.retry]",
        "[agent.<id>.retry.connector]",
        "[agent.<id>.slack]",
        "[[agent.<id>.slack.watch]]",
        "[[agent.<id>.mcp]]",
        "[agent.<id>.mcp.tools]",
        "[mcp.<id>]",
    ):
        assert block in blocks, (block, sorted(blocks))


# --- the page ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    does: str


def sections() -> dict[str, dict[str, Row]]:
    """The page's reference: each section's block (as its heading spells it, `<kind>` and
    `<id>` as placeholders; "" for the top level) -> its table's rows by key."""
    found: dict[str, dict[str, Row]] = {}
    for part in re.split(r"^(?=#{2,3} )", CONFIG_MD.read_text(), flags=re.M)[1:]:
        heading = part.splitlines()[0]
        named = re.search(r"`(\[\[?[^`]+\]\]?)`", heading)
        if heading.lower().endswith("top-level keys"):
            block = ""
        elif named:
            block = named.group(1)
        else:
            continue
        rows = re.findall(r"^\| `(\w+)` \|(.*)\|$", part, re.M)
        found[block] = {}
        for key, rest in rows:
            cells = [c.strip() for c in rest.split(" | ")]
            assert len(cells) == 3, f"docs/config.md {block}: the row of {key} has not 4 cells"
            found[block][key] = Row(key, *cells)
    return found


def _matches(heading: str, block: str) -> bool:
    """`[agent.<id>.retry.<kind>]` heads `[agent.<id>.retry.llm]`: a placeholder is a part."""
    parts = re.split(r"(<\w+>)", heading)
    pattern = "".join(r"[^.\]]+" if re.fullmatch(r"<\w+>", p) else re.escape(p) for p in parts)
    return re.fullmatch(pattern, block) is not None


def section_of(block: str, page: dict[str, dict[str, Row]]) -> dict[str, Row]:
    heads = [h for h in page if _matches(h, block)]
    title = block or "the top-level keys"
    assert heads, f"docs/config.md has no section for {title}"
    assert len(heads) == 1, f"docs/config.md has several sections for {title}: {heads}"
    return page[heads[0]]


def test_config_md_documents_every_key_of_the_model() -> None:
    page = sections()
    missing = [
        f"{k.block or 'top level'} {k.name}"
        for k in KEYS
        if k.name not in section_of(k.block, page)
    ]
    assert not missing, f"docs/config.md has no row for: {', '.join(missing)}"


def test_config_md_documents_no_key_the_model_lacks() -> None:
    page = sections()
    for heading, rows in page.items():
        blocks = {k.block for k in KEYS if _matches(heading, k.block)}
        assert blocks, f"docs/config.md's section {heading} is no block of subs.toml"
        known = {k.name for k in KEYS if k.block in blocks}
        extra = sorted(rows.keys() - known)
        assert not extra, f"docs/config.md's {heading or 'top level'} lists unknown keys {extra}"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | dict):
        return "[]" if isinstance(value, list) and not value else "{}" if not value else ""
    return str(value)


# Allowed values a validator decides, not a Literal: (block, key) -> the values.
VALIDATED = {("[[agent.<id>.tools]]", "handler"): sorted(default_kinds().tool_handlers())}


def allowed_values(key: Key) -> list[str]:
    if get_origin(key.annotation) is Literal:
        return [str(v) for v in get_args(key.annotation)]
    return VALIDATED.get((key.block, key.name), [])


def test_each_row_says_type_allowed_values_default_and_what_it_does() -> None:
    page = sections()
    for key in KEYS:
        row = section_of(key.block, page)[key.name]
        where = f"docs/config.md {key.block or 'top level'} {key.name}"
        assert row.type and row.does, f"{where}: an empty cell"
        for value in allowed_values(key):
            assert f'`"{value}"`' in row.type, f"{where}: allowed value {value!r} not named"
        if key.default is PydanticUndefined:
            assert row.default == "required", f"{where}: required, the page says {row.default!r}"
        elif key.default is None or isinstance(key.default, BaseModel):
            assert row.default != "required", f"{where}: not required"
        else:
            shown = f"`{_toml(key.default)}`"
            assert row.default.startswith(shown), f"{where}: default {shown}, page {row.default!r}"


# The rows of the page's table of retry defaults, by the policy each shows.
RETRY_ROWS = {
    "a model call": "llm",
    "a worker or MCP tool call": "tool",
    "a client tool call": "client_tool",
    "a subagent call": "subagent",
    "a worker decision": "decision",
    "a queued turn": "turn",
    "an MCP tool-list sync": "connector",
}


def test_the_retry_defaults_on_the_page_are_the_engines() -> None:
    text = CONFIG_MD.read_text()
    header = re.search(r"^\| effect \| block \| (.*) \|$", text, re.M)
    assert header, "docs/config.md has no table of retry defaults"
    columns = header.group(1).split(" | ")
    rows = dict(re.findall(r"^\| (an? [^|]+?) \| (.*) \|$", text[header.end() :], re.M))
    assert rows.keys() == RETRY_ROWS.keys(), sorted(rows)
    table = default_kinds()
    for label, policy in RETRY_ROWS.items():
        block, *values = rows[label].split(" | ")
        engine = table.policy(policy, None)
        shown = {c: None if v == "—" else int(v) for c, v in zip(columns, values, strict=True)}
        assert shown == engine, f"docs/config.md, retry defaults of {label}: {shown} != {engine}"
        blocks = {"default"} | (
            {table.agent_blocks[policy]} if policy in table.agent_blocks else set()
        )
        assert block.strip("`") in blocks, f"{label}: its block is one of {blocks}"


# --- the local-server example, run -------------------------------------------------------------


async def test_the_local_server_example_runs_a_turn_with_no_key(
    tmp_path: Path, vendor: FakeVendor
) -> None:
    [example] = [t for w, t in BLOCKS if w.startswith("docs/config.md") and "Ollama" in t]
    text = example.replace("http://127.0.0.1:11434/v1", vendor.openai_base())
    assert vendor.openai_base() in text
    config = tmp_path / "subs.toml"
    config.write_text(text)
    assert load_project(config, env={}).missing_env({}) == []
    vendor.push(Text("Hello from a local model."))
    # OPENAI_API_KEY is set (the test env's): the local server must not get it either.
    code, out, err = await subs("run", "-o", "pretty", "local", "hello", "-c", str(config))
    assert code == 0, err
    assert out.strip() == "Hello from a local model."
    [sent] = vendor.requests
    assert "authorization" not in sent.headers, sent.headers
