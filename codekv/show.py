"""Rendering chunks for ``codekv show``: highlighted code, anchors marked, def-use neighbours.

A terminal crops long code lines at its edge, as an editor's view does; into a pipe or a file,
where nothing scrolls, every line is written whole and the panel is as wide as the code.
"""

from __future__ import annotations

import sys

from rich.cells import cell_len
from rich.console import Console, Group
from rich.measure import Measurement
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

ANCHOR_STYLES = {
    "call": "underline bold",
    "branch": "on grey23",
    "return": "bold magenta",
    "assign": "underline",
    "def": "bold green",
    "use": "bold cyan underline",
    "import": "italic",
}
LEXERS = {"tsx": "tsx", "cpp": "cpp", "text": "text"}
TAB_SIZE = 4
PANEL_FRAME = 4  # a panel's two borders and their padding, in columns


def _position(text: bytes, offset: int) -> tuple[int, int]:
    """(1-based line, 0-based character column) of a byte offset in the chunk text."""
    line = text.count(b"\n", 0, offset) + 1
    line_start = text.rfind(b"\n", 0, offset) + 1
    return line, len(text[line_start:offset].decode("utf-8", "replace"))


def render_chunks(console: Console, index, chunks) -> None:
    for chunk in chunks:
        data = index.text(chunk)
        anchors = index.anchors(chunk)
        code = data.decode("utf-8", "replace")
        syntax = Syntax(
            code,
            LEXERS.get(chunk.language, chunk.language),
            line_numbers=True,
            start_line=chunk.start_line,
            word_wrap=False,
            tab_size=TAB_SIZE,
            code_width=None if console.is_terminal else _widest_line(code),
        )
        for anchor in anchors:
            start = _position(data, anchor.start_byte - chunk.start_byte)
            end = _position(data, anchor.end_byte - chunk.start_byte)
            syntax.stylize_range(ANCHOR_STYLES.get(anchor.kind, "underline"), start, end)
        counts: dict[str, int] = {}
        for anchor in anchors:
            counts[anchor.kind] = counts.get(anchor.kind, 0) + 1
        legend = Text("anchors: ")
        for kind, count in sorted(counts.items()):
            legend.append(f"{kind} {count}", style=ANCHOR_STYLES.get(kind, ""))
            legend.append("  ")
        neighbours = Text()
        linked = (("depends on", index.depends_on(chunk)), ("used by", index.used_by(chunk)))
        for label, others in linked:
            names = ", ".join(f"{c.path}::{c.qualname or c.kind}" for c in others[:12])
            more = f" (+{len(others) - 12} more)" if len(others) > 12 else ""
            neighbours.append(f"{label}: ", style="bold")
            neighbours.append((names or "-") + more + "\n")
        title = f"{chunk.path}::{chunk.qualname or chunk.kind}"
        if chunk.part:
            title += f" (part {chunk.part})"
        lines = f"lines {chunk.start_line}-{chunk.end_line}"
        subtitle = f"{chunk.kind} · {lines} · {chunk.n_tokens} tokens · {chunk.id}"
        panel = Panel(Group(syntax, legend, neighbours), title=title, subtitle=subtitle)
        if console.is_terminal:
            console.print(panel)
        else:
            needed = Measurement.get(console, console.options.update_width(sys.maxsize), syntax)
            width = max(console.width, needed.maximum + PANEL_FRAME)
            Console(file=console.file, width=width).print(panel)


def _widest_line(code: str) -> int:
    return max((cell_len(line.expandtabs(TAB_SIZE)) for line in code.splitlines()), default=1)
