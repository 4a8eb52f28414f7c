"""How ``switchyard ... --help`` is laid out: click's plain layout, whole at 80 columns.

Typer's rich panels put every option in one table row (names, negative names, type, help); at 80 columns that
leaves the help a dozen characters, and rich cuts option names, environment variables and defaults with "…". The
plain layout gives each option's help the rest of the line, starts it on a line of its own under a long name, and
wraps words without ever cutting one.
"""

from __future__ import annotations

import sys

import typer
from typer._click.core import Context  # typer 0.29 vendors click: the types its hooks are called with
from typer._click.formatting import HelpFormatter
from typer.core import TyperGroup

__all__ = ["WholeSummaries", "use_plain_help"]


class WholeSummaries(TyperGroup):
    """A command group that lists its commands with the first sentence of their help whole, wrapped: click's
    listing cuts it at the end of the line with "..."."""

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def use_plain_help(app: typer.Typer) -> None:
    """Lay out the help of ``app``, its commands and its command groups (call it once they are all added) as above."""
    app.rich_markup_mode = None  # inherited by every command and group below the app
    app.info.cls = WholeSummaries
    for group in app.registered_groups:  # a group's class is its own, not inherited
        group.cls = WholeSummaries
        if group.typer_instance is not None:
            use_plain_help(group.typer_instance)
