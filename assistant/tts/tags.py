"""Leading tags in text to speak: ``"[cheerful] Hi"``, ``"【关心】你还好吗"``.

One parser for every engine: expressive engines turn the tag into an instruction, the others drop it.
"""

from __future__ import annotations

import re

# Bracketed sounds expressive engines make (CosyVoice2's paralinguistic tokens), not style instructions.
SOUND_TAGS = frozenset({
    "breath", "noise", "laughter", "cough", "clucking", "accent", "quick_breath", "hissing", "sigh",
    "vocalized-noise", "lipsmack", "mn",
})

_LEADING_TAG = re.compile(r"^\s*[\[【]\s*([^\]】\n]{1,24}?)\s*[\]】]\s*")


def split_leading_tag(text: str) -> tuple[str | None, str]:
    """``"[cheerful] Hi"`` → ``("cheerful", "Hi")``; no tag → ``(None, text)``."""
    m = _LEADING_TAG.match(text)
    if not m:
        return None, text
    return m.group(1), text[m.end() :]


def split_style_tag(text: str) -> tuple[str | None, str]:
    """Like :func:`split_leading_tag`, but a sound such as ``[breath]`` is part of the text, not a style."""
    tag, rest = split_leading_tag(text)
    if tag is None or tag.lower() in SOUND_TAGS:
        return None, text
    return tag, rest
