"""The engines as Ray Serve applications: ``<ray.app_name>-tts``, ``<ray.app_name>-asr`` and ``<ray.app_name>-llm``.

Each application is one deployment whose options come from the config:

- TTS: ``ray.tts_replicas`` replicas of ``ray.tts_num_gpus`` GPUs each (1 for CosyVoice2 on CUDA: one per
  GPU). ``max_ongoing_requests`` per replica is the engine's own capacity, ``tts.max_concurrent`` slots plus
  ``tts.max_waiting`` places in its waiting room, so a replica never queues more than the engine would
  in-process. Each caller (gateway) holds at most a burst of the deployment's size plus ``ray.max_queued``
  requests that no replica has taken yet; the next one is refused (``BackPressureError`` → ``busy``, as
  in-process; see :func:`caller_queue`).
- ASR: ``ray.asr_replicas`` replicas of ``ray.asr_num_gpus`` GPUs (a fraction shares a GPU) or CPUs, each
  running ``asr.workers`` transcriptions at once with as many waiting on the replica.
- LLM (``respond.backend = "ray"``): ``ray.llm_replicas`` replicas of the embedded model, each taking its
  ``respond.slots`` replies plus ``respond.max_waiting`` waiting. A conversation is routed by a key of its
  start (Serve's multiplexing), so its turns find its prefix in the same replica's KV cache.

Three ways to deploy, all the same applications: a gateway with ``ray.deploy`` on deploys what is missing;
``assistant engines`` deploys and exits; ``serve deploy configs/serve.yaml`` uses the builders below
(``import_path: assistant.serve_ray.app:tts_app`` with ``args: {config: ..., overrides: {...}}``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from ray import serve
from ray.serve import Application

from assistant.config import Config, ConfigError, RespondConfig, load_config
from assistant.serve_ray import asr_capacity, caller_queue, llm_capacity, tts_capacity
from assistant.serve_ray.replicas import ASRReplica, LLMReplica, TTSReplica

log = logging.getLogger(__name__)

TTS_DEPLOYMENT = "TTS"
ASR_DEPLOYMENT = "ASR"
LLM_DEPLOYMENT = "LLM"


def tts_app_name(cfg: Config) -> str:
    return f"{cfg.ray.app_name}-tts"


def asr_app_name(cfg: Config) -> str:
    return f"{cfg.ray.app_name}-asr"


def llm_app_name(cfg: Config) -> str:
    return f"{cfg.ray.app_name}-llm"


# What each deployment's replicas are handed: only the settings they read (a section, or some of its keys), so
# that no secret of the gateway (server.auth_token, ice.turn_secret, respond.api_key) is given to Ray, its logs
# or its dashboard.
# ``telemetry`` (no secret in it: a collector's key goes in OTEL_EXPORTER_OTLP_HEADERS on the nodes) lets the
# replicas add their spans to the calls' traces (``traced.py``).
TTS_SETTINGS: dict[str, tuple[str, ...] | None] = {"tts": None, "tts_api": None, "ray": None,
                                                   "server": ("data_dir",), "telemetry": None}
ASR_SETTINGS: dict[str, tuple[str, ...] | None] = {"asr": None, "telemetry": None}
# The LLM replica gets every [respond] setting but the gateway's own (a list of what it may have let new settings
# — examples, history_turns, requantize, extra_buffers, cache_dir — stay behind): not the OpenAI-compatible
# server's address and key, not a plug-in's options (its secrets, and the replica runs the embedded model).
LLM_WITHHELD = ("api_key", "base_url", "options")
LLM_SETTINGS: dict[str, tuple[str, ...] | None] = {
    "respond": tuple(f.name for f in dataclasses.fields(RespondConfig) if f.name not in LLM_WITHHELD),
    "telemetry": None}


def replica_settings(cfg: Config, wanted: dict[str, tuple[str, ...] | None]) -> dict[str, dict[str, object]]:
    """The named sections (or keys of them) of ``cfg``, as the overrides a replica's config is made from."""
    full = cfg.to_dict()
    return {name: dict(full[name]) if keys is None else {k: full[name][k] for k in keys}
            for name, keys in wanted.items()}


def _application(cfg: Config, cls: type, name: str, replicas: int, num_cpus: float, num_gpus: float,
                 per_replica: int, settings: dict[str, tuple[str, ...] | None]) -> Application:
    """One deployment of ``cls`` with ``per_replica`` requests at once on each replica and the caller queue
    of :func:`~assistant.serve_ray.caller_queue`; the replicas get only ``settings`` of the config."""
    deployment = serve.deployment(name=name)(cls).options(
        num_replicas=max(1, replicas),
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
        max_ongoing_requests=per_replica,
        max_queued_requests=caller_queue(replicas, per_replica, cfg.ray.max_queued),
        health_check_period_s=5.0,
        graceful_shutdown_timeout_s=5.0,
    )
    return deployment.bind(replica_settings(cfg, settings))


def build_tts(cfg: Config) -> Application:
    r = cfg.ray
    return _application(cfg, TTSReplica, TTS_DEPLOYMENT, r.tts_replicas, r.tts_num_cpus, r.tts_num_gpus,
                        tts_capacity(cfg), TTS_SETTINGS)


def build_asr(cfg: Config) -> Application:
    r = cfg.ray
    return _application(cfg, ASRReplica, ASR_DEPLOYMENT, r.asr_replicas, r.asr_num_cpus, r.asr_num_gpus,
                        asr_capacity(cfg), ASR_SETTINGS)


def build_llm(cfg: Config) -> Application:
    r = cfg.ray
    return _application(cfg, LLMReplica, LLM_DEPLOYMENT, r.llm_replicas, r.llm_num_cpus, r.llm_num_gpus,
                        llm_capacity(cfg), LLM_SETTINGS)


def _config_from_args(args: Mapping[str, object]) -> Config:
    """``serve deploy`` builder args: ``config`` (a TOML file) and ``overrides`` ({section: {key: value}})."""
    path, overrides = args.get("config") or None, args.get("overrides") or None
    if path is not None and not isinstance(path, str):
        raise ConfigError(f"serve deploy args: 'config' must be a file name, got {path!r}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"serve deploy args: 'overrides' must be {{section: {{key: value}}}}, got {overrides!r}")
    return load_config(path, overrides=overrides)


def tts_app(args: Mapping[str, object]) -> Application:
    """Builder for ``serve deploy`` / ``serve run``: the TTS application."""
    return build_tts(_config_from_args(args))


def asr_app(args: Mapping[str, object]) -> Application:
    """Builder for ``serve deploy`` / ``serve run``: the ASR application."""
    return build_asr(_config_from_args(args))


def llm_app(args: Mapping[str, object]) -> Application:
    """Builder for ``serve deploy`` / ``serve run``: the embedded LLM application."""
    return build_llm(_config_from_args(args))


def start_local_cluster(num_cpus: int) -> str:
    """A Ray cluster on this machine only, with this process as its driver (benches and tests); the address
    other processes join it at."""
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, namespace="assistant", log_to_driver=False)
    return ray.get_runtime_context().gcs_address


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


def deploy(cfg: Config, *, tts: bool = True, asr: bool = True, llm: bool = False, force: bool = False) -> list[str]:
    """Deploy the engine applications that are not running (all of them with ``force``); their names."""
    join_cluster(cfg)
    serve.start(proxy_location="Disabled")  # gateways call through handles: no Serve HTTP proxy (as serve.yaml)
    running = running_apps()
    done = []
    for wanted, name, build in ((tts, tts_app_name(cfg), build_tts), (asr, asr_app_name(cfg), build_asr),
                                (llm, llm_app_name(cfg), build_llm)):
        if not wanted or (name in running and not force):
            continue
        log.info("ray.deploying app=%s", name)
        serve.run(build(cfg), name=name, route_prefix=None, blocking=False)
        done.append(name)
    return done
