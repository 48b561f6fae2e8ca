"""How every command prints to a person (check's rows, explain's report): whole lines when stdout
is not a terminal (a file, a pipe, a CI log keeps each line whole, to be grepped); on a terminal,
long lines wrap to its width with their continuation under their text, and a line that must stay
on one row is shortened with an ellipsis."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text


class Out:
    """Prints the report's lines: whole when not on a terminal; on one, wrapped to its width
    with continuation lines under the text (after the indent and the bullet)."""

    def __init__(self, console: Console):
        self.console = console
        self.tty = console.is_terminal

    def item(self, indent: int, bullet: str, body: str) -> None:
        """One paragraph: indent spaces, a bullet (markup) and the body (markup)."""
        if not self.tty:
            self.console.print(" " * indent + bullet + body, soft_wrap=True, highlight=False)
            return
        lead = indent + cell_len(Text.from_markup(bullet).plain)
        if lead == 0:
            self.console.print(body, highlight=False)
            return
        grid = Table.grid(padding=0)
        grid.add_column(width=lead, no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row(Text(" " * indent) + Text.from_markup(bullet), Text.from_markup(body))
        self.console.print(grid)

    def one_line(self, indent: int, body: str) -> None:
        """A line that is never wrapped: on a terminal, shortened to its width with an ellipsis."""
        if not self.tty:
            self.console.print(" " * indent + body, soft_wrap=True, highlight=False)
            return
        text = Text(" " * indent) + Text.from_markup(body)
        text.truncate(self.console.width, overflow="ellipsis")
        self.console.print(text, no_wrap=True, overflow="ellipsis", highlight=False)

    def blank(self) -> None:
        self.console.print()
