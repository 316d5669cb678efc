"""Every message npu-launch may print after ``npu-launch: error:``, found in the source.

A refusal is an exception of one of ``ERROR_CLASSES`` (``launcher.cli.main.main`` prints each as
``npu-launch: error: MESSAGE``, exit 2), a rank-table ``Fault`` (its third argument; ``validate``
lists them as ``JSON.path: message``), or a click parameter type's ``self.fail(...)``. Each call's
message is read as a template: its literal text, with ``PLACEHOLDER`` wherever an f-string puts a
value. A message built elsewhere and passed as a variable (``raise ConfigError(message)``) is
counted as ``dynamic``: its text is the template of the call that built it.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "parallel", "rank_tables")
ERROR_CLASSES = frozenset({
    "LaunchError", "ConfigError", "HostfileError", "ReportError", "ClickException", "UsageError",
    "BadParameter", "BadInput", "LayoutError", "RankTableError", "TableInputError",
    "InvalidRankTable", "UnreadableFile"})
PLACEHOLDER = "\x00"
"""Where an f-string puts a value; no message holds this character."""


@dataclasses.dataclass(frozen=True)
class Message:
    """One refusal's text as written in the source."""

    where: str
    template: str

    @property
    def literal(self) -> str:
        """The message's own words: the template without its values."""
        return self.template.replace(PLACEHOLDER, " ")

    @property
    def is_wrapper(self) -> bool:
        """Only puts a place (``file:line: ``) or an option before another message."""
        return len(re.sub(r"[^A-Za-z]", "", self.literal)) < 3

    def pattern(self) -> re.Pattern[str]:
        """Matches the message as a page writes it: each value as any text (``N``, ``HOST``)."""
        parts = [re.escape(part) for part in self.template.split(PLACEHOLDER)]
        return re.compile(".*?".join(parts), re.DOTALL)


def _called_name(func: ast.expr) -> Optional[str]:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def template_of(node: ast.expr) -> Optional[str]:
    """A message expression's text with its values as ``PLACEHOLDER``; None when it is built
    elsewhere (a variable, a call)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template_of(node.left), template_of(node.right)
        if left is None and right is None:
            return None
        return (left or PLACEHOLDER) + (right or PLACEHOLDER)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "strip":
        return template_of(node.func.value)
    return None


def _message_argument(call: ast.Call) -> Optional[ast.expr]:
    name = _called_name(call.func)
    if name in ERROR_CLASSES and name != "InvalidRankTable" and call.args:
        return call.args[0]
    if name == "Fault" and len(call.args) >= 3:
        return call.args[2]
    if name == "fail" and call.args and isinstance(call.func, ast.Attribute) \
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
        return call.args[0]
    return None


def messages(root: Path = REPO) -> Iterator[tuple[str, Optional[str]]]:
    """``(file:line, template)`` of every refusal in the packages; template None when dynamic."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    argument = _message_argument(node)
                    if argument is not None:
                        yield f"{path.relative_to(root)}:{node.lineno}", template_of(argument)


def static_messages(root: Path = REPO) -> list[Message]:
    """The refusals whose text is written at the call."""
    return [Message(where, template) for where, template in messages(root) if template is not None]


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def code_spans(markdown: str) -> list[str]:
    """The page's inline code and the lines of its code blocks, where messages are quoted."""
    spans, in_block = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block:
            spans.append(line.strip())
        else:
            spans += _CODE_SPAN.findall(line)
    return spans


def undocumented(found: list[Message], markdown: str) -> list[Message]:
    """The messages no code span of ``markdown`` quotes in full."""
    spans = code_spans(markdown)
    return [m for m in found if not any(m.pattern().fullmatch(span.removeprefix("npu-launch: error: "))
                                        for span in spans)]
