"""Bad input on either side of the seam, as ``parallel.contract`` re-exports it: the plain
exception (``BadInput``: ranks need no click) and how a user's value is echoed in its message.
Only the standard library."""
from __future__ import annotations


class BadInput(ValueError):
    """Bad input found on either side of the seam. A plain exception, so that ranks need no
    click; the CLI says it in one line with exit code 2."""

    @property
    def message(self) -> str:
        return str(self)


MAX_SHOWN = 80
"""Characters of a user's value echoed in an error message."""


def shown(value: object) -> str:
    """``repr`` of a value for an error message, cut to ``MAX_SHOWN`` characters."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}...({len(text)} chars)"
