"""MkDocs hook: the parts of pages written from the code, so that they cannot drift.

A page holds a marker line ``<!-- generated: NAME -->``; the hook puts in its place:

* ``contract-variables``: every environment variable ``parallel/contract.py`` names, with its
  section and docstring (read from the module's source, not imported);
* ``contract-events``: every event kind the ranks and the launcher write, likewise;
* ``msrun-help``: what ``npu-launch msrun --help`` prints;
* ``faults``: every entry of the diagnosis's knowledge base (``launcher/diagnose/faults.yaml``).

``tests/test_docs.py`` checks the generated tables name every variable and event.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "parallel" / "contract.py"
_MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*[A-Z0-9]")
_NOT_VARIABLES = ("ROLE_SCHEDULER", "ROLE_WORKER", "PREFIX")  # MS_ROLE's values; the prefix


class Constant(NamedTuple):
    """One module-level ``NAME = "value"`` of the contract, with what is said about it."""

    name: str
    value: str
    section: str
    doc: str


def contract_constants(path: Path = CONTRACT) -> Iterator[Constant]:
    """Every string constant at the top of ``path``, under the ``#`` comment above its group."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    body = ast.parse(source).body
    for i, node in enumerate(body):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue
        following = body[i + 1] if i + 1 < len(body) else None
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                and isinstance(following.value.value, str):
            doc = " ".join(following.value.value.split())
        yield Constant(node.targets[0].id, node.value.value, _section_above(lines, node.lineno),
                       doc)


def _section_above(lines: list[str], lineno: int) -> str:
    for line in reversed(lines[:lineno - 1]):
        if line.startswith("# "):
            return line[2:].rstrip(".")
    return ""


def contract_variables(path: Path = CONTRACT) -> list[Constant]:
    """The environment variables the contract names."""
    return [c for c in contract_constants(path) if _ENV_NAME.fullmatch(c.value)
            and not c.name.startswith(_NOT_VARIABLES)]


def contract_events(path: Path = CONTRACT) -> list[Constant]:
    """The event kinds the contract names."""
    return [c for c in contract_constants(path) if c.name.startswith("EVENT_")]


def _cell(text: str) -> str:
    """Docstring text as a table cell: reST's double backticks as Markdown's single ones."""
    return text.replace("``", "`").replace("|", "\\|") or "-"


def variables_table(path: Path = CONTRACT) -> str:
    """Markdown table of the contract's variables."""
    rows = [f"| `{c.value}` | {_cell(c.section)} | {_cell(c.doc)} |"
            for c in contract_variables(path)]
    return "\n".join(["| variable | group | what it carries |", "| --- | --- | --- |", *rows])


def events_table(path: Path = CONTRACT) -> str:
    """Markdown table of the contract's event kinds."""
    rows = [f"| `{c.value}` | {_cell(c.doc)} |" for c in contract_events(path)]
    return "\n".join(["| event | what it records |", "| --- | --- |", *rows])


def msrun_help() -> str:
    """What ``npu-launch msrun --help`` prints, as a code block."""
    from launcher.config.msrun_args import HELP
    return f"```text\n{HELP.rstrip()}\n```"


FAULTS = ROOT / "launcher" / "diagnose" / "faults.yaml"


def faults_table(path: Path = FAULTS) -> str:
    """Markdown table of every entry of the diagnosis's knowledge base, in its order."""
    import yaml
    rows = []
    for entry in yaml.safe_load(path.read_text(encoding="utf-8")):
        code = f"`{entry['code']}`" if entry.get("code") else "-"
        after = " (usually a consequence of another rank's fault)" if entry["consequence"] else ""
        after += " (healthy runs print it too: named only beside another finding)" \
            if entry.get("noise") else ""
        rows.append(f"| `{entry['id']}` | {code} | {_cell(entry['cause'])}{after} | "
                    f"{_cell(entry['fix'])} | [page]({entry['link']}) |")
    return "\n".join(["| id | code | cause | fix | link |", "| --- | --- | --- | --- | --- |", *rows])


GENERATORS = {"contract-variables": variables_table, "contract-events": events_table,
              "msrun-help": msrun_help, "faults": faults_table}


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it names; an unknown name is an error."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r} (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()
    return _MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs calls this with every page's Markdown before it renders it."""
    return expand(markdown)


CLI_PAGE = "reference/cli.md"
_UNSET = "<code>Sentinel.UNSET</code>"
"""What mkdocs-click 0.9 writes for an option without a default under click 8.3+ (click's
``UNSET``); such options say their computed default in their help ("[default: all cards]")."""


def help_placeholders() -> set[str]:
    """Every ``<...>`` in the commands' help texts (``<job id>``), which mkdocs-click writes out
    as it is and the Markdown renderer would take for an HTML tag."""
    import click

    from launcher.cli.main import cli

    def texts(command: click.Command) -> Iterator[str]:
        yield command.help or ""
        yield from (getattr(p, "help", None) or "" for p in command.params)
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from texts(sub)
    return {m for text in texts(cli) for m in re.findall(r"<[^<>]+>", text)}


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """The CLI reference as mkdocs-click rendered it, with no default shown as ``-`` and the
    help texts' ``<placeholders>`` shown, not swallowed as tags."""
    if page.file.src_uri != CLI_PAGE:
        return html
    for placeholder in help_placeholders():
        html = html.replace(placeholder, placeholder.replace("<", "&lt;").replace(">", "&gt;"))
    return html.replace(_UNSET, "-")


BENCH_PICTURES = "bench/results"
"""The plots BENCHMARKS.md shows, by paths from the repository's top (the benchmarks page
includes that file as it is, at the top of the site, so its links keep their meaning)."""


def on_files(files: Any, config: Any) -> Any:
    """Add BENCHMARKS.md's pictures to the site, at the paths its links name."""
    from mkdocs.structure.files import File
    for picture in sorted((ROOT / BENCH_PICTURES).glob("*.png")):
        files.append(File(picture.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"],
                          config["use_directory_urls"]))
    return files
