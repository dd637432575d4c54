"""Plain-text tables that fit the terminal: the demo's and the benchmark's.

A table wider than the terminal has its widest columns narrowed, and their
cells wrapped onto continuation lines (at spaces where possible), so that no
line is wider than the terminal and no text is lost.
"""
import shutil
import textwrap
from typing import List, Optional, Sequence

MIN_COL = 8      # a column is never narrowed below this (or its header)
MAX_WORD = 24    # nor below its longest word, up to this many characters
GAP = "  "


def terminal_width(default: int = 100) -> int:
    """Columns of the terminal (or $COLUMNS); ``default`` when not a terminal."""
    return shutil.get_terminal_size((default, 24)).columns


def format_table(head: Sequence[str], rows: Sequence[Sequence[str]],
                 width: Optional[int] = None) -> str:
    """Render rows under head within width columns (default: the terminal's).

    Every line of the result is at most width characters wide, unless even
    the minimum column widths do not fit.
    """
    width = terminal_width() if width is None else width
    n = len(head)
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(x[i]) for x in [list(head)] + cells) for i in range(n)]
    # A column keeps room for its header and its longest word (up to
    # MAX_WORD), so that words are broken only when nothing else fits.
    longest = [max((len(w) for x in [list(head)] + cells for w in x[i].split()), default=0)
               for i in range(n)]
    floor = [min(widths[i], max(MIN_COL, len(head[i]), min(longest[i], MAX_WORD)))
             for i in range(n)]
    while sum(widths) + len(GAP) * (n - 1) > width:
        # Narrow the widest column that can still give up a character.
        i = max((i for i in range(n) if widths[i] > floor[i]), key=lambda i: widths[i],
                default=None)
        if i is None:
            break
        widths[i] -= 1

    def render(row: Sequence[str]) -> List[str]:
        parts = [textwrap.wrap(c, widths[i], break_on_hyphens=False) or [""]
                 for i, c in enumerate(row)]
        height = max(len(p) for p in parts)
        return [GAP.join(((p[k] if k < len(p) else "").ljust(widths[i]))
                         for i, p in enumerate(parts)).rstrip()
                for k in range(height)]

    out = render(head)
    out.append(GAP.join("-" * w for w in widths))
    wrapped = any(len(render(r)) > 1 for r in cells)
    for r in cells:
        lines = render(r)
        out.extend(lines)
        if wrapped and len(lines) > 1 and r is not cells[-1]:
            out.append("")            # a wrapped row ends with a blank line
    return "\n".join(out)
