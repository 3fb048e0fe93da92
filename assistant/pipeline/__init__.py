"""The conversation of one session, from the user's audio to the bot's reply, with no transport in it.

    conversation.py  the two halves below wired together; what a session (page, Realtime) drives
    turn_taking.py   when the user is done, barges in, or only says "mm-hm" (reads VAD events and evidence)
    end_of_turn.py   the end-of-turn policy: the transcript rule and the evidence at a pause weighed
    turn_runner.py   one committed turn: ASR → responder → synthesis → reply sink
    turn.py          a turn as the runner holds it; reply.py: the reply's sink and its progress
    synthesis.py     the bot's text → audio at the listener's rate (the bot's speech; "speech" elsewhere is the
                     user's)
    clock.py         the session's sample clock; trace.py: the per-turn marks and the latency breakdown;
    events.py        the events channel to the page

Each piece of a turn's state has one writer: turn-taking writes the pause's evidence, the runner the reply's
progress; the other side reads a snapshot or awaits a future.
"""
