"""The code blocks of the project's Markdown pages and the commands in them, as the tests read them."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from support import REPO

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # the page's path in the repository, e.g. "README.md"
    line: int  # the line of its opening fence, from 1
    language: str  # the fence's language ("bash", "python"), "" for none
    code: str  # the block's text, without the fences

    def printed(self) -> str:
        """What a Python block says it prints: its full-line comments (`# text` from the first column), in order,
        one output line each."""
        return "".join(line[2:] + "\n" for line in self.code.splitlines() if line.startswith("# "))


def commands(line: str) -> list[str]:
    """The commands of one line of a shell block as written, split at `&&`, without the line's comment."""
    words, found = shlex.split(line, comments=True), []
    while words:
        cut = words.index("&&") if "&&" in words else len(words)
        found.append(shlex.join(words[:cut]))
        words = words[cut + 1:]
    return found


def code_blocks(page: str, language: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (a path in the repository), of one ``language`` when it is given."""
    text = (REPO / page).read_text()
    blocks = [Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)]
    return [b for b in blocks if language is None or b.language == language]


def pinned(requirements: Path, package: str) -> str:
    """The version a requirements file pins ``package`` to (`package==version`)."""
    return re.search(rf"^{re.escape(package)}==([^\s#]+)", requirements.read_text(), re.M).group(1)
