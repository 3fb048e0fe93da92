"""Per-session conversation memory, bounded so a long call cannot grow without limit."""

from __future__ import annotations

from collections import deque

from assistant.respond.base import Message


class ConversationHistory:
    """The last ``max_turns`` user/assistant pairs of one session, oldest first.

    A turn that was interrupted (barge-in) is stored with what was actually said, which may be empty.
    """

    def __init__(self, max_turns: int = 8) -> None:
        if max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {max_turns}")
        self.max_turns = max_turns
        self._turns: deque[tuple[str, str]] = deque(maxlen=max_turns)
        # What the assistant last said (as heard), kept even with max_turns 0: turn-taking reads what was asked
        # ("What is your four-digit PIN?") to tell a finished answer from a half-said one.
        self.last_reply = ""

    def add_turn(self, user: str, assistant: str) -> None:
        """Record one finished turn; the oldest pair drops out once ``max_turns`` is reached."""
        self.last_reply = assistant
        if self.max_turns == 0:
            return
        self._turns.append((user, assistant))

    def clear(self) -> None:
        self._turns.clear()
        self.last_reply = ""

    def __len__(self) -> int:
        return len(self._turns)

    @property
    def messages(self) -> list[Message]:
        """The stored turns as alternating user/assistant messages (no system prompt)."""
        out: list[Message] = []
        for user, assistant in self._turns:
            out.append(Message("user", user))
            if assistant:
                out.append(Message("assistant", assistant))
        return out
