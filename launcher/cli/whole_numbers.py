"""The type of every whole-number option of ``npu-launch run`` and ``preflight``.

click's ``int`` takes ``'１'``, ``'١٢'`` and ``'1_0'`` (ten ranks), and says a 5000-digit value
is wrong in 500 characters; docs/reference/bounds.md promises ASCII digits. The range of each
option is checked where the value is used (``LaunchConfig``), so a leading ``-`` passes here
and gets that check's message, which says the range.
"""
from __future__ import annotations

import re
from typing import Optional

import click

from launcher.errors import ConfigError
from launcher.limits import shown
from rank_tables.bounded import MAX_NUMBER_CHARS

_NUMBER = re.compile(r"-?[0-9]+")


class WholeNumber(click.ParamType):
    """An integer written in ASCII digits; anything else is one line naming the option."""

    name = "integer"

    def convert(self, value: object, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> int:
        if type(value) is int:  # a default, or a config file's YAML integer (checked there)
            return value
        text, option = str(value), option_name(param)
        if not _NUMBER.fullmatch(text):
            raise ConfigError(f"{option} {shown(text)}: expected a whole number written in "
                              "digits 0-9")
        if len(text) > MAX_NUMBER_CHARS:
            raise ConfigError(f"{option} {shown(text)}: a number of {len(text)} digits; at most "
                              f"{MAX_NUMBER_CHARS} are accepted")
        return int(text)


WHOLE_NUMBER = WholeNumber()


def option_name(param: Optional[click.Parameter]) -> str:
    """How messages name the option: its first long name (``--console``, not ``console_ranks``)."""
    if isinstance(param, click.Option):
        return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return (param.name if param is not None else None) or "the value"
