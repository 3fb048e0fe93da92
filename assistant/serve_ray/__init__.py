"""The engines as Ray Serve deployments, shared by many gateways (the optional ``.[ray]`` extra).

``tts.backend = "ray"`` / ``asr.backend = "ray"`` make a gateway use them; the default, ``local``, never
imports Ray. ``replicas.py`` is what runs on a replica, ``app.py`` builds and deploys the applications,
``client.py`` is the gateway's side of the hop. This module itself imports nothing from Ray.
"""

from __future__ import annotations

from assistant.config import Config


def tts_capacity(cfg: Config) -> int:
    """Requests one TTS replica takes at once: the engine's slots plus its waiting room."""
    return max(1, cfg.tts.max_concurrent) + max(0, cfg.tts.max_waiting)


def tts_gateway_capacity(cfg: Config) -> int:
    """Syntheses one gateway's TTS service lets through with the ray backend: twice what the deployment takes
    from it (every replica full plus the gateway's queue at the handle), so that the deployment, not this
    bound, says ``busy``; the bound only caps what one gateway holds open."""
    return 2 * (max(1, cfg.ray.tts_replicas) * tts_capacity(cfg) + max(0, cfg.ray.max_queued))
