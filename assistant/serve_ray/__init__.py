"""The engines as Ray Serve deployments, shared by many gateways (the optional ``.[ray]`` extra).

``tts.backend = "ray"`` / ``asr.backend = "ray"`` / ``respond.backend = "ray"`` make a gateway use them; the
default, ``local``, never imports Ray. ``replicas.py`` is what runs on a replica, ``app.py`` builds and deploys
the applications, ``client.py`` is the gateway's side of the hop. This module itself imports nothing from Ray.
"""

from __future__ import annotations

from assistant.config import Config


def tts_capacity(cfg: Config) -> int:
    """Requests one TTS replica takes at once: the engine's slots plus its waiting room."""
    return max(1, cfg.tts.max_concurrent) + max(0, cfg.tts.max_waiting)


def asr_capacity(cfg: Config) -> int:
    """Requests one ASR replica takes at once: ``asr.workers`` running and as many waiting on the replica (it
    reports that wait apart from the hop)."""
    return 2 * max(1, cfg.asr.workers)


def llm_capacity(cfg: Config) -> int:
    """Replies one LLM replica takes at once: the model's slots plus its waiting room (past that it says busy)."""
    return max(1, cfg.respond.slots) + max(0, cfg.respond.max_waiting)


def caller_queue(replicas: int, per_replica: int, extra: int) -> int:
    """Serve's ``max_queued_requests`` (per caller): Serve counts a request as queued until a replica has
    taken it, so a burst that the replicas can take at once must fit in this queue, or it would be refused
    while replicas are free; ``ray.max_queued`` more may wait for one to free up."""
    return max(1, max(1, replicas) * per_replica + max(0, extra))


def tts_gateway_capacity(cfg: Config) -> int:
    """Syntheses one gateway's TTS service lets through with the ray backend: one more than the deployment
    takes from that gateway (every replica full, and its queue at the handle full), so that the deployment,
    not this bound, says ``busy``; the bound only caps what one gateway holds open."""
    per_replica = tts_capacity(cfg)
    replicas = max(1, cfg.ray.tts_replicas)
    return replicas * per_replica + caller_queue(replicas, per_replica, cfg.ray.max_queued) + 1
