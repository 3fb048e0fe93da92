"""Leading tags in text to speak: ``"[cheerful] Hi"``, ``"【关心】你还好吗"``.

One parser for every engine: expressive engines turn the tag into an instruction, the others drop it.
"""

from __future__ import annotations

import re

_LEADING_TAG = re.compile(r"^\s*[\[【]\s*([^\]】\n]{1,24}?)\s*[\]】]\s*")


def split_leading_tag(text: str) -> tuple[str | None, str]:
    """``"[cheerful] Hi"`` → ``("cheerful", "Hi")``; no tag → ``(None, text)``."""
    m = _LEADING_TAG.match(text)
    if not m:
        return None, text
    return m.group(1), text[m.end() :]
