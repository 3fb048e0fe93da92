"""The engines as Ray Serve applications: ``<ray.app_name>-tts`` and ``<ray.app_name>-asr``.

Each application is one deployment whose options come from the config:

- TTS: ``ray.tts_replicas`` replicas of ``ray.tts_num_gpus`` GPUs each (1 for CosyVoice2 on CUDA: one per
  GPU). ``max_ongoing_requests`` per replica is the engine's own capacity, ``tts.max_concurrent`` slots plus
  ``tts.max_waiting`` places in its waiting room, so a replica never queues more than the engine would
  in-process. Each caller (gateway) holds at most a burst of the deployment's size plus ``ray.max_queued``
  requests that no replica has taken yet; the next one is refused (``BackPressureError`` → ``busy``, as
  in-process; see :func:`caller_queue`).
- ASR: ``ray.asr_replicas`` replicas of ``ray.asr_num_gpus`` GPUs (a fraction shares a GPU) or CPUs, each
  running ``asr.workers`` transcriptions at once with as many waiting on the replica.

Three ways to deploy, all the same applications: a gateway with ``ray.deploy`` on deploys what is missing;
``assistant engines`` deploys and exits; ``serve deploy configs/serve.yaml`` uses the builders below
(``import_path: assistant.serve_ray.app:tts_app`` with ``args: {config: ..., overrides: {...}}``).
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve import Application

from assistant.config import Config, load_config
from assistant.serve_ray import tts_capacity
from assistant.serve_ray.replicas import ASRReplica, TTSReplica

log = logging.getLogger(__name__)

TTS_DEPLOYMENT = "TTS"
ASR_DEPLOYMENT = "ASR"


def tts_app_name(cfg: Config) -> str:
    return f"{cfg.ray.app_name}-tts"


def asr_app_name(cfg: Config) -> str:
    return f"{cfg.ray.app_name}-asr"


def caller_queue(replicas: int, per_replica: int, extra: int) -> int:
    """Serve's ``max_queued_requests`` (per caller): Serve counts a request as queued until a replica has
    taken it, so a burst that the replicas can take at once must fit in this queue, or it would be refused
    while replicas are free; ``ray.max_queued`` more may wait for one to free up."""
    return max(1, max(1, replicas) * per_replica + max(0, extra))


def build_tts(cfg: Config) -> Application:
    deployment = serve.deployment(TTSReplica, name=TTS_DEPLOYMENT).options(
        num_replicas=max(1, cfg.ray.tts_replicas),
        ray_actor_options={"num_cpus": cfg.ray.tts_num_cpus, "num_gpus": cfg.ray.tts_num_gpus},
        max_ongoing_requests=tts_capacity(cfg),
        max_queued_requests=caller_queue(cfg.ray.tts_replicas, tts_capacity(cfg), cfg.ray.max_queued),
        health_check_period_s=5.0,
        graceful_shutdown_timeout_s=5.0,
    )
    return deployment.bind(cfg.to_dict())


def build_asr(cfg: Config) -> Application:
    deployment = serve.deployment(ASRReplica, name=ASR_DEPLOYMENT).options(
        num_replicas=max(1, cfg.ray.asr_replicas),
        ray_actor_options={"num_cpus": cfg.ray.asr_num_cpus, "num_gpus": cfg.ray.asr_num_gpus},
        # as many waiting as working, on the replica (it reports the wait apart from the hop)
        max_ongoing_requests=2 * max(1, cfg.asr.workers),
        max_queued_requests=caller_queue(cfg.ray.asr_replicas, 2 * max(1, cfg.asr.workers), cfg.ray.max_queued),
        health_check_period_s=5.0,
        graceful_shutdown_timeout_s=5.0,
    )
    return deployment.bind(cfg.to_dict())


def _config_from_args(args: dict[str, Any]) -> Config:
    """``serve deploy`` builder args: ``config`` (a TOML file) and ``overrides`` ({section: {key: value}})."""
    return load_config(args.get("config") or None, overrides=args.get("overrides") or None)


def tts_app(args: dict[str, Any]) -> Application:
    """Builder for ``serve deploy`` / ``serve run``: the TTS application."""
    return build_tts(_config_from_args(args))


def asr_app(args: dict[str, Any]) -> Application:
    """Builder for ``serve deploy`` / ``serve run``: the ASR application."""
    return build_asr(_config_from_args(args))


def join_cluster(cfg: Config) -> None:
    """Connect this process to the Ray cluster of ``ray.address`` (once; later calls do nothing)."""
    import ray

    if ray.is_initialized():
        return
    ray.init(address=cfg.ray.address or "auto", namespace=cfg.ray.namespace, log_to_driver=False,
             logging_level=logging.WARNING)
    log.info("ray.joined address=%s namespace=%s", cfg.ray.address, cfg.ray.namespace)


def running_apps() -> set[str]:
    """Names of the Serve applications running now (empty when Serve is not started)."""
    try:
        status = serve.status()
    except Exception:
        return set()
    return {name for name, app in status.applications.items() if str(app.status).endswith("RUNNING")}


def deploy(cfg: Config, *, tts: bool = True, asr: bool = True, force: bool = False) -> list[str]:
    """Deploy the engine applications that are not running (all of them with ``force``); their names."""
    join_cluster(cfg)
    serve.start(http_options={"host": "127.0.0.1"})
    running = running_apps()
    done = []
    for wanted, name, build in ((tts, tts_app_name(cfg), build_tts), (asr, asr_app_name(cfg), build_asr)):
        if not wanted or (name in running and not force):
            continue
        log.info("ray.deploying app=%s", name)
        serve.run(build(cfg), name=name, route_prefix=None, blocking=False)
        done.append(name)
    return done
