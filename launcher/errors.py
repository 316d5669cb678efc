"""Errors people read. Only ``launcher.cli.main`` turns them into an exit."""
from __future__ import annotations

import click


class LaunchError(click.ClickException):
    """Bad input found before anything started: one line, exit code 2."""

    exit_code = 2


class ConfigError(LaunchError):
    """A bad option, config file or combination of settings."""


class HostfileError(LaunchError):
    """A bad hostfile; the message starts with ``file:line``."""
