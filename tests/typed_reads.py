"""Where ``launcher/`` reads a plain dict with ``.get(``, found by mypy's types: run as a script
from the repository's root (mypy reads its settings from pyproject.toml there), it prints one
JSON object, ``{"outside": [...], "edge": [...], "typed": N, "untyped": [...], "errors": [...]}``:
``errors`` are mypy's own findings over the whole tree, as ``mypy`` run there prints them (one
build serves both of tests/test_style.py's mypy checks).

A plain dict is one whose values are untyped: ``dict[str, Any]``, a ``Mapping[str, Any]``,
``Any`` itself (what ``json.loads`` returns). ``.get(`` on one reads a record by field name, and
the launcher does that only at the edge, where a file's or a message's JSON becomes a typed
value: the modules in ``EDGE_MODULES`` and functions whose names say they make a value from JSON
(``EDGE_FUNCTIONS``). Everywhere else a record is a typed value by the time it is read. A
lookup in a typed map (``dict[int, RankRecord]``, an environment's ``Mapping[str, str]``) is
no record read and is counted as ``typed``. ``untyped`` lists the calls whose receiver mypy gave
no type for (the check is blind there: tests/test_style.py requires none).
"""
from __future__ import annotations

import json
import re
import sys
from typing import Iterator

from mypy import build
from mypy.main import process_options
from mypy.nodes import CallExpr, ClassDef, Decorator, FuncDef, MemberExpr, Node, OverloadedFuncDef
from mypy.server.subexpr import get_subexpressions
from mypy.types import AnyType, Instance, Type, get_proper_type

EDGE_MODULES = {
    "launcher.observe.read_values": "typed readers of one value a file holds (Fields)",
    "launcher.observe.metrics_records": "metrics.jsonl's lines as typed records",
    "launcher.cli.run_config": "click's options and the --config file into a LaunchConfig",
}
EDGE_FUNCTIONS = re.compile(r"(from_\w+|parse\w*|_parse\w*)")
"""``from_json``, ``from_dict``, ``parse``...: a typed value made from JSON."""
_MAPPINGS = {"builtins.dict", "typing.Mapping", "typing.MutableMapping", "collections.OrderedDict",
             "collections.defaultdict"}


def _is_plain(receiver: Type) -> bool:
    """A dict whose values are untyped, or an untyped value."""
    proper = get_proper_type(receiver)
    if isinstance(proper, AnyType):
        return True
    if isinstance(proper, Instance) and proper.type.fullname in _MAPPINGS and len(proper.args) == 2:
        value = get_proper_type(proper.args[1])
        return isinstance(value, AnyType) or (isinstance(value, Instance)
                                              and value.type.fullname == "builtins.object")
    return False


def _functions(defs: list) -> Iterator[tuple[str, Node]]:
    """(the name of the function it is in, or "", a statement or function) of a module's body."""
    for node in defs:
        if isinstance(node, ClassDef):
            yield from _functions(node.defs.body)
        elif isinstance(node, FuncDef):
            yield node.name, node
        elif isinstance(node, (Decorator, OverloadedFuncDef)):
            yield node.name, node
        else:
            yield "", node


def main() -> None:
    files, options = process_options(["--no-incremental", "--cache-dir", "/dev/null"])
    options.export_types = True
    options.preserve_asts = True
    result = build.build(files, options)
    found: dict[str, list[str]] = {"outside": [], "edge": [], "untyped": []}
    typed = 0
    for module, state in sorted(result.graph.items()):
        if not module.startswith("launcher") or state.tree is None:
            continue
        for function, node in _functions(state.tree.defs):
            for expr in get_subexpressions(node):
                if not (isinstance(expr, CallExpr) and isinstance(expr.callee, MemberExpr)
                        and expr.callee.name == "get"):
                    continue
                where = f"{state.xpath}:{expr.line}"
                receiver = result.types.get(expr.callee.expr)
                if receiver is None:
                    found["untyped"].append(where)
                elif not _is_plain(receiver):
                    typed += 1
                elif module in EDGE_MODULES or EDGE_FUNCTIONS.fullmatch(function):
                    found["edge"].append(where)
                else:
                    found["outside"].append(f"{where}: {get_proper_type(receiver)}")
    json.dump({**found, "typed": typed, "errors": result.errors}, sys.stdout)


if __name__ == "__main__":
    main()
