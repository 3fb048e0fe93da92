"""The Serve config file builds the same applications, with the same options, as ``assistant engines``."""

from __future__ import annotations

from pathlib import Path

import yaml
from ray._common.utils import import_attr
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.schema import ServeDeploySchema

from assistant.config import load_config
from assistant.serve_ray import caller_queue, llm_capacity, tts_capacity, tts_gateway_capacity
from assistant.serve_ray.app import asr_app_name, build_asr, build_tts, llm_app_name, tts_app_name

REPO = Path(__file__).resolve().parents[1]


def test_serve_yaml_builds_the_engine_applications(monkeypatch) -> None:
    monkeypatch.chdir(REPO)  # the file's config paths are relative to the repository, as `serve deploy` runs
    schema = ServeDeploySchema.model_validate(yaml.safe_load((REPO / "configs/serve.yaml").read_text()))
    default = load_config(environ={})
    assert [a.name for a in schema.applications] == [tts_app_name(default), asr_app_name(default),
                                                     llm_app_name(default)]
    for app in schema.applications:
        built = call_user_app_builder_with_args_if_necessary(import_attr(app.import_path), app.args)
        deployment = built._bound_deployment
        cfg = load_config(app.args["config"], overrides=app.args["overrides"], environ={})
        if app.name.endswith("-tts"):
            assert deployment.num_replicas == cfg.ray.tts_replicas == 2
            assert deployment.ray_actor_options["num_gpus"] == cfg.ray.tts_num_gpus == 1
            assert deployment.max_ongoing_requests == tts_capacity(cfg) == 16  # slots + waiting room
            assert deployment._deployment_config.max_queued_requests == caller_queue(2, 16, cfg.ray.max_queued)
            assert cfg.tts.engine == "cosyvoice2"
        elif app.name.endswith("-asr"):
            assert deployment.ray_actor_options["num_gpus"] == cfg.ray.asr_num_gpus == 0.25
            assert cfg.asr.workers == 2
            assert deployment.max_ongoing_requests == 4  # as many waiting on the replica as working
        else:  # the embedded LLM: its slots plus its waiting room per replica, on a quarter of a GPU
            assert deployment.ray_actor_options["num_gpus"] == cfg.ray.llm_num_gpus == 0.25
            assert (cfg.respond.engine, cfg.respond.gpu_layers) == ("llama", -1)
            assert deployment.max_ongoing_requests == llm_capacity(cfg) == 16 + 8
            # What crosses to the replica: the model's settings, never the gateway's API key.
            assert "api_key" not in deployment.init_args[0]["respond"]


def test_gateway_bound_leaves_busy_to_the_deployment() -> None:
    cfg = load_config(environ={}, overrides={"tts": {"backend": "ray", "max_concurrent": 2, "max_waiting": 1},
                                             "ray": {"tts_replicas": 3, "max_queued": 2}})
    # what the deployment takes from one gateway: 3 replicas × (2 + 1), and 2 waiting at the handle
    assert caller_queue(3, tts_capacity(cfg), cfg.ray.max_queued) == 11
    assert tts_gateway_capacity(cfg) > 3 * tts_capacity(cfg) + cfg.ray.max_queued
    # the gateway's own bound lets through one more than the deployment takes (9 running + 11 queued), so
    # the deployment is the one that says busy
    assert tts_gateway_capacity(cfg) == 9 + 11 + 1


def test_replicas_are_handed_only_the_settings_they_read() -> None:
    """No secret of the gateway crosses to Ray: a replica's config holds only the sections its engine reads."""
    cfg = load_config(environ={}, overrides={
        "server": {"auth_token": "gateway-secret", "data_dir": "/srv/voices"},
        "ice": {"turn_secret": "turn-secret"}, "respond": {"api_key": "llm-secret"}})
    # telemetry: the replicas' spans join the calls' traces (it holds no secret: a collector's key is an OTEL_*
    # variable on the nodes)
    for build, sections in ((build_tts, {"tts", "tts_api", "ray", "server", "telemetry"}),
                            (build_asr, {"asr", "telemetry"})):
        (settings,) = build(cfg)._bound_deployment.init_args
        assert set(settings) == sections
        assert "secret" not in repr(settings)
    (tts_settings,) = build_tts(cfg)._bound_deployment.init_args
    assert tts_settings["server"] == {"data_dir": "/srv/voices"}


def test_the_llm_replica_gets_every_model_setting_the_gateway_has() -> None:
    """Every [respond] setting reaches the embedded model on its replica, as the gateway's config has it (the
    replica's config is read back from what crosses): the persona's example turns, the history kept, the weights'
    rewrite, llama.cpp's extra buffers, the cache, the prompt left unset; only the gateway's own stay behind."""
    import dataclasses

    from assistant.serve_ray.app import LLM_WITHHELD, build_llm
    from assistant.serve_ray.replicas import config_from_dict

    mine = {"examples": False, "history_turns": 3, "requantize": "off", "extra_buffers": True,
            "cache_dir": "/var/cache/models", "slots": 2, "language": "fr", "max_tokens": 120,
            "api_key": "llm-secret", "base_url": "http://10.0.0.9/v1", "options": {"token": "plugin-secret"}}
    cfg = load_config(environ={}, overrides={"respond": mine})
    (settings,) = build_llm(cfg)._bound_deployment.init_args
    replica = config_from_dict(settings).respond
    gateway = dataclasses.asdict(cfg.respond)
    for name, value in dataclasses.asdict(replica).items():
        if name in LLM_WITHHELD:
            assert name not in settings["respond"] and value == getattr(type(replica)(), name), name
        else:
            assert value == gateway[name], name
    assert replica.system_prompt is None and replica.temperature is None  # unset stays unset: the engine's own
    assert "secret" not in repr(settings) and "10.0.0.9" not in repr(settings)
