"""Engines in supervised child processes: a native fault (a segfault in llama.cpp, the OOM killer, a hang) ends
that process, not the server and its calls.

- ``wire.py``: the frames both sides exchange over a private socket pair (length-prefixed pickles).
- ``child.py``: the child's main: builds the hosted object from a factory, serves calls and streams, ends with
  its parent.
- ``supervisor.py``: the parent's side: starts the child, watches it (exit, pings, streams that stop moving),
  fails what was in flight when it dies, restarts it with backoff, and gives up plainly on a crash loop.

What a child hosts is any object with async methods; the responder's face over it is ``respond/hosted.py``.
"""
