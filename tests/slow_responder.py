"""A responder plug-in for the v2v bench test: the echo reply, held back 300 ms before its first word.

Loaded as ``respond.engine = "tests.slow_responder:SlowEcho"``; the bench must show the delay in
``llm_first_text_ms`` and in ``v2v_ms``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from assistant.respond.base import Message
from assistant.respond.echo import EchoResponder

DELAY_S = 0.3


class SlowEcho:
    """Echo, but sleeps ``delay_s`` before yielding the first delta (a slow LLM's time to first token)."""

    name = "slow-echo"

    def __init__(self, delay_s: float = DELAY_S) -> None:
        self.delay_s = delay_s
        self._echo = EchoResponder()

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        await asyncio.sleep(self.delay_s)
        async for delta in self._echo.respond(text, history):
            yield delta
