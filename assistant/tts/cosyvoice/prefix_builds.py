"""Cold voices' flow prefixes, built between other streams' chunks and kept in the prompt cache.

A stream of a voice whose `FlowPrefix` is not built yet starts cold on its own flow state (`streaming.py`)
and names the prefix it lacks; `PrefixBuilds` builds it one encoder chunk (one 50-frame solve) per piece, so
later requests of that voice are warm while no stream waits for a whole prefix. The chunk thread runs a
piece only when it has nothing else to do and no request is still waiting for its first audio: a piece is
not interrupted, and a first packet must not wait behind one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from assistant.tts.cosyvoice.batch_work import Work, WorkSteps, run_grouped
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.prompt_cache import PromptCache
from assistant.tts.cosyvoice.streaming import MissingPrefix

log = logging.getLogger(__name__)

MAX_PREFIX_BUILDS = 2   # cold voices' prefixes built at once (each holds a voice's whole flow state)


@dataclass(eq=False)
class _Build:
    missing: MissingPrefix
    steps: WorkSteps[FlowPrefix]
    pending: Work | None = None
    started: bool = False


class PrefixBuilds:
    """The prefixes under construction (at most ``max_builds``), advanced a batched piece at a time."""

    def __init__(self, cache: PromptCache, max_builds: int = MAX_PREFIX_BUILDS,
                 on_built: Callable[[FlowPrefix], None] | None = None) -> None:
        self.cache, self.max_builds, self.on_built = cache, max_builds, on_built
        self._builds: list[_Build] = []
        self.built = 0

    def __bool__(self) -> bool:
        return bool(self._builds)

    def want(self, missing: MissingPrefix) -> None:
        """Queue the build of a prefix a cold stream lacks (unless under way already, or too many are)."""
        if len(self._builds) < self.max_builds and all(b.missing.key != missing.key for b in self._builds):
            self._builds.append(_Build(missing, missing.build_steps()))

    def step(self, max_batch: int, buckets: Sequence[int] = ()) -> int:
        """One piece of the oldest build, batched with other builds whose next piece matches; returns how many
        pieces ran (0: a build ended or failed on advancing)."""
        for build in list(self._builds):
            if not build.started:
                build.started = True
                self._advance(build, first=True)
        if not self._builds:
            return 0
        leader = self._builds[0]
        assert leader.pending is not None
        key = (type(leader.pending), leader.pending.batch_key(buckets))
        batch = [b for b in self._builds if b.pending is not None
                 and (type(b.pending), b.pending.batch_key(buckets)) == key][:max_batch]
        try:
            run_grouped([b.pending for b in batch if b.pending is not None], buckets)
        except Exception:
            log.exception("cosyvoice prefix build failed")
            for build in batch:
                self._builds.remove(build)
            return 0
        for build in batch:
            self._advance(build)
        return len(batch)

    def _advance(self, build: _Build, first: bool = False) -> None:
        try:
            build.pending = next(build.steps) if first else build.steps.send(None)
        except StopIteration as stop:
            self._builds.remove(build)
            prefix: FlowPrefix = stop.value
            self.cache.put("flow", build.missing.key, prefix)
            self.built += 1
            log.info("cosyvoice voice prefix built (%d prompt tokens)", prefix.prompt_tokens)
            if self.on_built is not None:
                self.on_built(prefix)
        except Exception:
            log.exception("cosyvoice prefix build failed")
            self._builds.remove(build)


__all__ = ["MAX_PREFIX_BUILDS", "PrefixBuilds"]
