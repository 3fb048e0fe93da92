"""A responder plug-in for the Ray tests: a long reply (a dozen sentences), so a turn's speech is still being
made seconds after it starts and a TTS replica can be killed in the middle of it.

Loaded as ``respond.engine = "tests.long_responder:LongReply"``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from assistant.respond.base import Message

SENTENCES = 12


class LongReply:
    name = "long-reply"

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        yield f"You said: {text.strip()} "
        for i in range(1, SENTENCES + 1):
            yield f"Here is sentence {i} of a long answer, spoken piece by piece. "
