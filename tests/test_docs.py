"""The documentation stays true to the code: the site builds with ``mkdocs build --strict``
(offline), its command-line reference and environment table are generated from the code, every
refusal in the code is quoted in the troubleshooting page, the README is a landing page that lists
the site's pages, and ``npu-launch --help`` shows its options in groups, each command an example."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import messages
import pytest
import yaml
from click.testing import CliRunner
from helpers import REPO

from launcher.cli import help_groups as cli_help
from launcher.cli.main import cli
from parallel import contract

DOCS = REPO / "docs"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "_hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages() -> list[str]:
    """Every page the site's navigation lists, as paths under docs/."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def walk(entries: list) -> list[str]:
        pages = []
        for entry in entries:
            for value in (entry.values() if isinstance(entry, dict) else [entry]):
                pages += walk(value) if isinstance(value, list) else [value]
        return pages
    return walk(config["nav"])


# The site ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def _page(site: Path, path: str) -> str:
    return (site / path.removesuffix(".md") / "index.html").read_text() if not path.endswith("index.md") \
        else (site / "index.html").read_text()


def test_every_page_of_the_navigation_is_built(site: Path) -> None:
    for page in _nav_pages():
        assert _page(site, page), page


def test_the_cli_reference_is_generated_from_the_click_commands(site: Path) -> None:
    html = _page(site, "reference/cli.md")
    assert "mkdocs-click" in (DOCS / "reference" / "cli.md").read_text()
    run = cli.commands["run"]
    for option in (o for p in run.params if isinstance(p, click.Option) for o in p.opts):
        assert option in html, f"{option} missing from the generated CLI reference"
    for name in ("run", "preflight", "report", "msrun", "rank-table", "rank-table generate",
                 "rank-table from-hostfile"):
        assert f'id="npu-launch-{name.replace(" ", "-")}"' in html, name
    assert "Sentinel" not in html and "npu_launch_logs/&lt;job id&gt;" in html


def test_the_environment_page_names_every_variable_of_the_contract(site: Path) -> None:
    html = _page(site, "reference/environment.md")
    variables = {value for name, value in vars(contract).items()
                 if isinstance(value, str) and name.isupper() and value.startswith(contract.PREFIX)
                 and value != contract.PREFIX}
    variables |= set(contract.OWNED) | {s[0] for s in contract.RankIdentity.SOURCES.values()}
    assert len(variables) > 30
    missing = sorted(v for v in variables if f"<code>{v}</code>" not in html)
    assert not missing, f"not on the environment page: {missing}"


def test_the_log_directory_page_names_every_event_kind(site: Path) -> None:
    html = _page(site, "reference/log-dir.md")
    kinds = [v for n, v in vars(contract).items() if n.startswith("EVENT_") and isinstance(v, str)]
    assert len(kinds) > 10 and all(f"<code>{k}</code>" in html for k in kinds)


def test_the_incoming_notes_are_left_out_of_the_site(site: Path) -> None:
    """Other helpers' notes wait in docs/_incoming/ (not in the navigation) until they are folded
    into their pages; --strict would refuse a page the navigation leaves out."""
    excluded = yaml.safe_load((REPO / "mkdocs.yml").read_text())["exclude_docs"].split()
    assert "_incoming/" in excluded and "_hooks/" in excluded
    assert not (site / "_incoming").exists() and not (site / "_hooks").exists()


def test_the_hook_refuses_a_marker_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        _hook().expand("<!-- generated: nope -->")


def test_the_environment_table_follows_the_contract(tmp_path: Path) -> None:
    """A variable added to the contract appears in the table without a word of documentation."""
    copy = tmp_path / "contract.py"
    copy.write_text((REPO / "parallel" / "contract.py").read_text()
                    + '\n# New ones.\nBRAND_NEW = "NPU_LAUNCH_BRAND_NEW"\n"""Carries news."""\n')
    table = _hook().variables_table(copy)
    assert "| `NPU_LAUNCH_BRAND_NEW` | New ones | Carries news. |" in table


# Troubleshooting ---------------------------------------------------------------------------------

def test_every_refusal_in_the_code_is_quoted_in_troubleshooting() -> None:
    found = messages.static_messages()
    assert len(found) > 200, "the scan finds the refusals (raise ConfigError(...), ...)"
    page = (DOCS / "troubleshooting.md").read_text()
    missing = messages.undocumented([m for m in found if not m.is_wrapper], page)
    assert not missing, "quote these in docs/troubleshooting.md (values in CAPITALS):\n" + "\n".join(
        f"{m.where}: {m.template.replace(messages.PLACEHOLDER, 'VALUE')}" for m in missing)


def test_a_refusal_missing_from_the_page_is_found(tmp_path: Path) -> None:
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "x.py").write_text(
        'def f(n):\n    raise ConfigError(f"--frobs {n}: expected a frob count")\n')
    found = messages.static_messages(tmp_path)
    assert [m.where for m in found] == ["launcher/x.py:2"]
    assert messages.undocumented(found, "- `--frobs N: expected a frob count`") == []
    assert messages.undocumented(found, "- `--frobs N: expected a count`") == found


# The README --------------------------------------------------------------------------------------

def test_the_readme_is_a_landing_page_listing_the_site() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    linked = set(re.findall(r"\]\(docs/([^)#]+)\)", readme))
    assert not set(_nav_pages()) - linked, f"pages the README does not list: {set(_nav_pages()) - linked}"
    for target in linked:
        assert (DOCS / target).is_file(), target


def test_the_quick_start_is_the_same_in_the_readme_and_the_site() -> None:
    def commands(text: str) -> list[str]:
        block = re.search(r"## Quick start.*?```sh\n(.*?)```", text, re.DOTALL)
        assert block is not None
        return block.group(1).splitlines()
    readme = commands((REPO / "README.md").read_text())
    assert readme == commands((DOCS / "getting-started.md").read_text())
    assert readme[0] == 'pip install -e ".[examples]" && npu-launch --cards 2 scripts/train_digits.py'
    ci = (REPO / ".ci" / "run").read_text()
    assert readme[1] in ci


# --help ------------------------------------------------------------------------------------------

def _help(*args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--help"], prog_name="npu-launch", terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def test_help_groups_every_option_and_shows_defaults() -> None:
    text = _help()
    titles = [title for title, _ in cli_help.OPTION_GROUPS]
    positions = [text.index(f"\n{title}:\n") for title in titles]
    assert positions == sorted(positions)
    run = cli.commands["run"]
    stray = [p.opts for p in run.params if isinstance(p, click.Option)
             and cli_help.group_of(p) == cli_help.OTHER_OPTIONS]
    assert stray == [], "give these options a group in launcher/cli/help_groups.py"
    grouped = [n for _, names in cli_help.OPTION_GROUPS for n in names]
    assert len(grouped) == len(set(grouped))
    hangs = text[text.index("\nHangs:\n"):text.index("\nLogs and console:\n")]
    assert "--hang-timeout" in hangs and "[default: learnt from the job" in hangs


def _commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path] if path else []
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            paths += _commands(sub, (*path, name))
    return paths


def test_every_command_shows_an_example() -> None:
    for path in _commands(cli):
        text = _help(*path)
        example = cli_help.EXAMPLES[" ".join(path)]
        # msrun's help is its own text (the option mapping), the example after it
        gap = "\n" if path == ("msrun",) else "\n\n"
        assert re.search(rf"Example:{gap} +{re.escape(example)}\n", text), path
        words = example.split()
        assert words[0] == "npu-launch" and (path == ("run",) or words[1:1 + len(path)] == list(path))
