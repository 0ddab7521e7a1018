"""Model Markdown becomes Slack mrkdwn (notes/slack-facts.md §1.8), also when cut mid-token."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.rendering.mrkdwn import escape, to_mrkdwn

CASES = [
    # (name, markdown, mrkdwn)
    ("bold", "**bold** and __also__", "*bold* and *also*"),
    ("italic", "*it* and _it_", "_it_ and _it_"),
    ("bold italic", "***both***", "*_both_*"),
    ("nested", "**bold _and it_**", "*bold _and it_*"),
    ("italic around bold", "*a **b** c*", "_a *b* c_"),
    ("strike", "~~gone~~ ~kept~", "~gone~ ~kept~"),
    ("link", "see [docs](https://x.io/a?b=1&c=2)", "see <https://x.io/a?b=1&amp;c=2|docs>"),
    ("link label markup", "[**bold** `x`](https://x.io)", "<https://x.io|bold x>"),
    ("link with parens", "[w](https://w.org/Foo_(bar))", "<https://w.org/Foo_(bar)|w>"),
    ("link with title", '[t](https://x.io "Title")', "<https://x.io|t>"),
    ("link url delimiters", "[t](<https://x.io/a|b c>)", "<https://x.io/a%7Cb%20c|t>"),
    ("image", "![a cat](https://x.io/c.png)", "<https://x.io/c.png|a cat>"),
    ("relative link", "[guide](/docs/guide)", "guide (/docs/guide)"),
    ("autolink", "<https://x.io/?a&b>", "<https://x.io/?a&amp;b>"),
    ("heading", "## Results **now**", "*Results now*"),
    ("heading closing hashes", "# Title #", "*Title*"),
    ("hashtag", "#general is busy", "#general is busy"),
    ("bullets", "- a\n* b\n+ c", "• a\n• b\n• c"),
    ("nested bullets", "- a\n  - b", "• a\n  • b"),
    ("tasks", "- [ ] todo\n- [x] done", "☐ todo\n☑ done"),
    ("numbered", "1. one\n2) two **b**", "1. one\n2) two *b*"),
    ("rule", "above\n\n---\n\nbelow", "above\n\n──────────\n\nbelow"),
    ("quote", "> wise **words**\n>> deeper", "> wise *words*\n> deeper"),
    ("escape", "a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("html", "<b>hi</b>", "&lt;b&gt;hi&lt;/b&gt;"),
    ("mentions kept", "ask <@U012AB> in <#C0123|ops>", "ask <@U012AB> in <#C0123|ops>"),
    ("broadcast defused", "<!channel> <!here>", "&lt;!channel&gt; &lt;!here&gt;"),
    ("code span verbatim", "`a **b** [c](d)`", "`a **b** [c](d)`"),
    ("code span escaped", "`if a<b && c`", "`if a&lt;b &amp;&amp; c`"),
    ("code span broadcast", "`<!here>`", "`&lt;!here&gt;`"),
    ("double backtick span", "``a ` b``", "`a \u02cb b`"),
    ("triple backtick span", "```x```", "`x`"),
    (
        "fence drops language",
        "```python\nprint('**x**')\n```\nafter **b**",
        "```\nprint('**x**')\n```\nafter *b*",
    ),
    ("fence escapes", "```\nif a < b: x &= 1\n```", "```\nif a &lt; b: x &amp;= 1\n```"),
    (
        "tilde fence",
        "~~~\n```\ninner\n```\n~~~",
        "```\n`\u200b`\u200b`\ninner\n`\u200b`\u200b`\n```",
    ),
    ("indented fence", "- step:\n  ```sh\n  ls -l\n  ```", "• step:\n```\nls -l\n```"),
    ("snake case", "use snake_case_names", "use snake_case_names"),
    ("math stars", "2*3*4 and 5 * 6", "2*3*4 and 5 * 6"),
    ("escaped punctuation", r"\[not a link\](x) 1\. a", "[not a link](x) 1. a"),
    ("escaped backticks", r"\`\`\`", "\u02cb\u02cb\u02cb"),
    ("spaced nested quote", ">  > deep", "> deep"),
    (
        "table",
        "| name | qty |\n|:-----|----:|\n| **apple** | 3 |\n| pear | 12 |",
        "```\nname  | qty\n------+----\napple |   3\npear  |  12\n```",
    ),
    ("table escapes", "| a |\n|---|\n| x<y |", "```\na\n---\nx&lt;y\n```"),
    ("ragged table", "| a | b |\n|---|---|\n| 1 |", "```\na | b\n--+--\n1 |\n```"),
    ("pipes but no table", "a | b", "a | b"),
    ("crlf", "**a**\r\nb", "*a*\nb"),
    ("blank lines kept", "a\n\n\nb", "a\n\n\nb"),
    # Cut off mid-stream: what is there renders, nothing leaks past its line.
    ("unclosed bold", "**unclosed\nnext *line*", "**unclosed\nnext _line_"),
    ("unclosed fence", "```js\nlet x = 1;", "```\nlet x = 1;\n```"),
    ("fence opener only", "text\n```", "text\n```\n\n```"),
    ("unclosed span", "`code and **b**", "`code and *b*"),
    ("unclosed link", "[docs](https://x.io/pa", "[docs](https://x.io/pa"),
    ("unclosed label", "[doc", "[doc"),
    ("cut mention", "hi <@U01", "hi &lt;@U01"),
    ("cut bullet", "- a\n- ", "• a\n• "),
    ("cut heading", "#", ""),
    ("table header only", "| a | b |", "| a | b |"),
    ("private use chars", "\ue000 x", "\ufffd x"),
]


@pytest.mark.parametrize(
    ("markdown", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_converts(markdown: str, expected: str) -> None:
    assert to_mrkdwn(markdown) == expected


def test_escape_only_touches_the_three_control_characters() -> None:
    assert escape("a & b < c > d \"e\" 'f'") == "a &amp; b &lt; c &gt; d \"e\" 'f'"


def test_an_unclosed_marker_does_not_change_other_lines() -> None:
    full = "Intro with **bold**.\n\n- item _one_\n\nEnd [link](https://x.io)."
    broken = "Intro with **bold.\n\n- item _one_\n\nEnd [link](https://x.io)."
    assert to_mrkdwn(full).split("\n")[1:] == to_mrkdwn(broken).split("\n")[1:]


DOCUMENT = """# Report

Here is **the plan** for _today_, see [the doc](https://x.io/?a=1&b=2).

| step | owner |
|------|-------|
| build | <@U1> |

```python
if a < b and c > d:
    print("**not bold**")
```

> note: `x & y`

1. first
2. second ~~old~~
"""


def test_every_prefix_of_a_stream_is_well_formed() -> None:
    for end in range(len(DOCUMENT) + 1):
        _assert_well_formed(to_mrkdwn(DOCUMENT[:end]))


_TOKENS = [
    "**", "*", "_", "__", "~~", "`", "``", "```", "```py", "~~~", "[", "]", "](", "(", ")",
    "!", "https://a.b/c?d=1&e=2", "<", ">", "&", "|", "|---|", "#", "# ", "- ", "* ", "1. ",
    "> ", "\n", "\n\n", " ", "word", "x_y", "<@U12>", "<!here>", "---", "\\", ":",
]  # fmt: skip


@given(st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join))
def test_any_markdown_gives_well_formed_mrkdwn(markdown: str) -> None:
    _assert_well_formed(to_mrkdwn(markdown))


_ALLOWED_TOKEN = re.compile(
    r"<(?:https?|mailto):[^<>|\s]+(?:\|[^<>]*)?>|<@[UW][A-Z0-9]+(?:\|[^<>]*)?>"
    r"|<#C[A-Z0-9]+(?:\|[^<>]*)?>"
)


def _assert_well_formed(out: str) -> None:
    """Fences pair up; `<`, `>` and `&` appear only as entities, Slack tokens or quotes."""
    assert sum(1 for line in out.split("\n") if line == "```") % 2 == 0, out
    bare = _ALLOWED_TOKEN.sub("", out)
    assert "<" not in bare, out
    for line in bare.split("\n"):
        assert ">" not in (line[1:] if line.startswith(">") else line), out
    assert re.search(r"&(?!amp;|lt;|gt;)", bare) is None, out
