"""The default responder: says back what it heard, so the whole loop runs with no model or server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from assistant import languages
from assistant.config import RespondConfig
from assistant.respond.base import Message, ReplyOptions

# The echo in the turn's language: (template with {text}, reply to nothing heard); English is the prefix's.
ECHOES = {
    "zh": ("你说：{text}", "我没有听清楚。"),
    "ja": ("「{text}」とおっしゃいました。", "よく聞き取れませんでした。"),
    "ko": ("{text}라고 말씀하셨어요.", "잘 못 알아들었어요."),
}


def words_as_deltas(text: str) -> list[str]:
    """Split ``text`` into word deltas (``"a b"`` → ``["a", " b"]``) that join back to it exactly."""
    parts = text.split(" ")
    return [p if i == 0 else " " + p for i, p in enumerate(parts)]


class EchoResponder:
    """Replies ``"You said: <text>"``, streamed word by word with no artificial delay."""

    name = "echo"

    def __init__(self, cfg: RespondConfig | None = None, *, prefix: str = "You said: ",
                 empty_reply: str = "I did not catch that.") -> None:
        self.prefix = prefix
        self.empty_reply = empty_reply

    def reply_for(self, text: str, language: str | None = None) -> str:
        """The echo, in ``language`` (None: what the text's script says, else English)."""
        said = " ".join(text.split())
        lang = language or languages.script_language(said)
        if lang in ECHOES:
            template, empty = ECHOES[lang]
            return template.replace("{text}", said.rstrip("。．.")) if said else empty
        return f"{self.prefix}{said}" if said else self.empty_reply

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        for delta in words_as_deltas(self.reply_for(text, options.language if options is not None else None)):
            yield delta

    async def aclose(self) -> None:
        """Nothing to release; present so every responder can be closed the same way."""
