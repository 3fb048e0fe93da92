"""The process-wide engines every session shares: VAD model, ASR runner, TTS engine, responder, metrics.

They are loaded and warmed once at start (off the event loop); ``/readyz`` turns ready only after that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from aiohttp import web

from assistant.config import Config, RespondConfig, VADConfig
from assistant.respond.base import Responder
from assistant.respond.skills.base import CallContext
from assistant.server.metrics import Metrics
from assistant.tts.base import TTSEngine

if TYPE_CHECKING:
    from assistant.asr.base import Transcriber
    from assistant.engine_host.supervisor import EngineProcess
    from assistant.pipeline.end_of_turn import EndOfTurnModel
    from assistant.respond.auto import Choice
    from assistant.respond.hosted import HostedResponder
    from assistant.respond.skills.registry import Skills
    from assistant.respond.skills.timers import CallTimers
    from assistant.respond.upgrade import ModelStatus, ModelUpgrade
    from assistant.telemetry.setup import Telemetry
    from assistant.vad.endpoint import Endpointer
    from assistant.vad.silero import SileroModel

log = logging.getLogger(__name__)


BACKENDS = ("local", "ray")
PLACED = (*BACKENDS, "process")  # engines that may also run in a supervised child process (engine_host/)


def _backend(value: str, section: str, allowed: tuple[str, ...] = BACKENDS) -> str:
    if value not in allowed:
        raise ValueError(f"{section}.backend must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _ray_client() -> Any:
    try:
        from assistant.serve_ray import client
    except ImportError as exc:
        raise RuntimeError(f"backend = ray needs Ray Serve ({exc}): pip install -e '.[ray]'") from exc
    return client


@dataclass
class Services:
    cfg: Config
    metrics: Metrics = field(default_factory=Metrics)
    vad_model: SileroModel | None = None
    asr: Transcriber | None = None  # asr.runner.ASRRunner, or serve_ray.client.RemoteASR
    tts: TTSEngine | None = None
    responder: Responder | None = None
    end_of_turn: EndOfTurnModel | None = None  # vad.end_of_turn.SmartTurnBatcher, shared by every session
    telemetry: Telemetry | None = None  # OpenTelemetry when on (the app starts and stops it: server/app.py)
    ready: bool = False
    load_error: str = ""  # why loading failed (``/readyz`` says it; ``assistant serve`` exits on it)
    load_seconds: dict[str, float] = field(default_factory=dict)

    engines: dict[str, EngineProcess] = field(default_factory=dict)  # engines in supervised child processes

    _responders: dict[str, Responder] = field(default_factory=dict)
    skills: Skills | None = None  # respond.skills, loaded with the engines (a plug-in that fails fails the start)
    model: ModelStatus | None = None  # respond.model_path = auto: which model answers and why (/readyz, the page)
    _upgrade: ModelUpgrade | None = None  # the machine's model on its way (respond/upgrade.py)
    _model_listeners: list[Callable[[ModelStatus], None]] = field(default_factory=list)

    def allowed_responders(self) -> list[str]:
        """Responders a client may pick per session: the built-in ones and the configured one.

        Never a ``module:Class`` from a client: that would let a request import any module.
        """
        return sorted({"echo", "rules", self.cfg.respond.engine})

    def responder_for(self, name: str | None) -> Responder:
        """The shared responder of that name (created once), or the configured one."""
        from assistant.respond import create_responder

        if not name or name == self.cfg.respond.engine:
            assert self.responder is not None
            return self.responder
        if name not in self.allowed_responders():
            raise ValueError(f"responder must be one of {self.allowed_responders()}")
        if name not in self._responders:
            cfg = dataclasses.replace(self.cfg.respond, engine=name)
            self._responders[name] = create_responder(cfg, debug_content=self.cfg.log.debug_content)
        return self._responders[name]

    def describe_responder(self, name: str | None = None) -> dict[str, Any]:
        """Which responder (and model) answers a session that picked ``name`` (None: the configured one)."""
        engine = name or self.cfg.respond.engine
        responder = self._responders.get(engine) or (self.responder if engine == self.cfg.respond.engine else None)
        describe = getattr(responder, "describe", None)
        if describe is not None:
            return dict(describe())
        model = self.cfg.respond.model if engine == "openai" else ""
        return {"engine": engine, "model": model}

    def call_context(self, timers: CallTimers | None = None) -> CallContext:
        """A new call's side of the skills: ``respond.timezone`` (until the page sends its own) and its timers."""
        zone = self.cfg.respond.timezone
        return CallContext(timezone=ZoneInfo(zone) if zone else None, timers=timers)

    def with_skills(self, responder: Responder, call: CallContext, respond: RespondConfig | None = None) -> Responder:
        """``responder`` with the skills for one call (respond/skills/responder.py), as ``respond`` (the call's
        config; default: the server's) sets the intent step; itself when there are none."""
        from assistant.respond.skills import with_skills

        r = respond or self.cfg.respond
        return with_skills(responder, self.skills, call, intents=r.intents, language=r.language)

    def make_endpointer(self, vad: VADConfig | None = None) -> Endpointer:
        """A session's endpointer on the shared VAD model, with ``vad`` settings (default: the config's)."""
        from assistant.vad.endpoint import Endpointer

        return Endpointer(vad or self.cfg.vad, self.vad_model)

    async def load(self) -> None:
        """Load every model, then warm each up, so the first user sees warm numbers."""
        from assistant.asr import create_asr
        from assistant.asr.runner import ASRRunner
        from assistant.respond import create_responder
        from assistant.respond.hosted import placement
        from assistant.tts import create_tts
        from assistant.vad.silero import SileroModel

        cfg = self.cfg
        where = placement(cfg.respond)  # a bad respond.backend fails now
        auto: Choice | None = None
        if self.skills is None:
            from assistant.respond.skills import load_skills

            self.skills = load_skills(cfg.respond.skills, timeout_s=cfg.respond.skill_timeout_s)
        if self.responder is None and cfg.respond.engine.strip() == "llama" and where != "ray":
            from assistant.respond.hub import is_hub_ref, resolve_model
            from assistant.respond.llama import resolve_model_path

            if cfg.respond.model_path.strip() == "auto":  # the machine's model if pulled, else the bundled one now
                from assistant.respond.auto import resolve_auto

                respond, auto = await asyncio.to_thread(resolve_auto, cfg.respond)
                self.cfg = cfg = dataclasses.replace(cfg, respond=respond)

            if is_hub_ref(cfg.respond.model_path):  # a hub model: pulled now unless an earlier pull left it
                respond = await asyncio.to_thread(resolve_model, cfg.respond, progress=True)
                self.cfg = cfg = dataclasses.replace(cfg, respond=respond)

            resolve_model_path(cfg.respond)  # a missing or foreign model file fails now, before anything loads

        async def timed(name: str, coro: Any) -> Any:
            t0 = time.perf_counter()
            result = await coro
            self.load_seconds[name] = round(time.perf_counter() - t0, 3)
            return result

        if self.vad_model is None:
            self.vad_model = await timed("vad", asyncio.to_thread(SileroModel))
        if self.end_of_turn is None:
            from assistant.vad.end_of_turn import SmartTurnBatcher, SmartTurnModel

            model = await timed("end_of_turn", asyncio.to_thread(SmartTurnModel))
            self.end_of_turn = SmartTurnBatcher(model)
        if self.asr is None and _backend(cfg.asr.backend, "asr", PLACED) == "ray":
            connect_asr = _ray_client().connect_asr

            self.asr = await timed("asr", asyncio.to_thread(connect_asr, cfg, self.metrics.observe_ray_hop))
        if self.asr is None and cfg.asr.backend == "process":
            from assistant.asr.hosted import ChildASREngine

            child = ChildASREngine(cfg.asr, on_change=self.metrics.observe_engine)
            self.engines[child.host.name] = child.host
            await timed("asr", child.start())  # loaded and warmed up in the child
            self.asr = ASRRunner(child, cfg.asr)
        if self.asr is None:
            engine = await timed("asr", asyncio.to_thread(create_asr, cfg.asr))
            self.asr = ASRRunner(engine, cfg.asr)
            await timed("asr_warmup", asyncio.to_thread(engine.warmup))
        if self.tts is None and _backend(cfg.tts.backend, "tts") == "ray":
            connect_tts = _ray_client().connect_tts

            self.tts = await timed("tts", asyncio.to_thread(connect_tts, cfg, self.metrics.observe_ray_hop))
        if self.tts is None:
            # A voice per language loads now only for what a turn can be in (what the ASR hears, tts.language);
            # any other on its first request (routing.py).
            reachable = {*getattr(self.asr, "languages", ()), cfg.tts.language}
            self.tts = await timed("tts", asyncio.to_thread(create_tts, cfg.tts, reachable))
            await timed("tts_warmup", self.tts.warmup())
        if self.responder is None and where == "ray":
            connect_llm = _ray_client().connect_llm

            self.responder = await timed("respond", asyncio.to_thread(connect_llm, cfg))
        if self.responder is None and where == "process":
            self.responder = await timed("respond", self._start_hosted())
        if self.responder is None:
            # Off the event loop: the embedded model loads its weights here (a bad file fails the start).
            self.responder = await timed("respond", asyncio.to_thread(
                create_responder, cfg.respond, debug_content=cfg.log.debug_content))
            warmup = getattr(self.responder, "warmup", None)
            if warmup is not None:
                await timed("respond_warmup", warmup())
        if auto is not None:
            self._start_auto(auto)
        self._responders[cfg.respond.engine] = self.responder
        self.ready = True
        log.info("services_loaded %s", " ".join(f"{k}_s={v}" for k, v in self.load_seconds.items()))

    async def _start_hosted(self, cfg: RespondConfig | None = None, *, register: bool = True) -> HostedResponder:
        """The responder in its supervised child process (``respond/hosted.py``), with its fallback; ready (loaded
        and warm) or failed for good (a crash loop: the fallback answers, ``/readyz`` says why). ``register``: its
        health counts for ``/readyz`` from now on (a model being swapped in counts once it answers)."""
        from assistant.respond import create_responder
        from assistant.respond.hosted import hosted_responder

        cfg = cfg or self.cfg.respond
        fallback = None
        if cfg.fallback.strip():  # echo or rules (load_config checks it): nothing to load, still off the loop
            fallback = await asyncio.to_thread(
                create_responder, dataclasses.replace(cfg, engine=cfg.fallback.strip(), backend="local"))
        hosted = await asyncio.to_thread(hosted_responder, cfg, fallback, self.metrics.observe_engine)
        if register:
            self.engines[hosted.host.name] = hosted.host
        try:
            await hosted.start()
        except BaseException:
            if not register:
                await hosted.aclose()
            raise
        if hosted.host.start_seconds and register:
            self.load_seconds["respond_warmup"] = round(hosted.host.start_seconds, 3)
        return hosted

    # --- respond.model_path = auto (respond/auto.py, respond/upgrade.py) ----------------------------------------
    def _start_auto(self, choice: Choice) -> None:
        """Say which model answers and why, and fetch the machine's model in the background if it is not here."""
        from assistant.respond.auto import BUNDLED
        from assistant.respond.hub import offline
        from assistant.respond.swap import SwappableResponder
        from assistant.respond.upgrade import ModelStatus, ModelUpgrade

        r = self.cfg.respond
        assert self.responder is not None
        if r.model_path:
            status = ModelStatus(choice.model, f"{choice.why}; pulled earlier", "ready", choice.model)
        elif not choice.model:
            status = ModelStatus(BUNDLED, choice.why, "bundled")
        elif not r.auto_pull or offline():
            off = "respond.auto_pull is off" if not r.auto_pull else "HF_HUB_OFFLINE is set"
            status = ModelStatus(BUNDLED, f"{choice.why}, but {off}: the bundled model answers", "bundled",
                                 choice.model)
        else:
            status = ModelStatus(BUNDLED, f"the bundled model answers while {choice.model} is pulled ({choice.why})",
                                 "pulling", choice.model)
        self.model = status
        self.responder = swappable = SwappableResponder(self.responder, status.why)
        log.info("respond.auto answers=%s state=%s why=%s", status.answers, status.state, status.why)
        if status.state == "pulling":
            self._upgrade = ModelUpgrade(choice, swappable, self._make_model, status, self._model_changed)
            self._upgrade.start()

    async def _make_model(self, path: str, gpu_layers: int) -> Responder:
        """The pulled model, made as the configured responder is (in its child process by default), loaded and
        warm; an error if it does not come up."""
        from assistant.respond import create_responder
        from assistant.respond.hosted import placement

        r = self.cfg.respond
        cfg = dataclasses.replace(r, model_path=path, gpu_layers=gpu_layers or r.gpu_layers)
        if placement(cfg) == "process":
            hosted = await self._start_hosted(cfg, register=False)
            if not hosted.health.ready:
                health = hosted.health
                await hosted.aclose()
                raise RuntimeError(f"its engine is {health.state}: {health.reason}")
            return hosted
        responder: Any = await asyncio.to_thread(create_responder, cfg, debug_content=self.cfg.log.debug_content)
        try:
            warmup = getattr(responder, "warmup", None)
            if warmup is not None:
                await warmup()
        except BaseException:
            await responder.aclose()
            raise
        return responder

    def _model_changed(self, status: ModelStatus) -> None:
        from assistant.respond.swap import SwappableResponder

        if isinstance(self.responder, SwappableResponder):
            self.responder.why = status.why
            host = getattr(self.responder.current, "host", None)
            if status.state == "ready" and host is not None:  # the new model's child process counts from now on
                self.engines[host.name] = host
        for listener in list(self._model_listeners):
            try:
                listener(status)
            except Exception:
                log.exception("model_listener_failed")

    def on_model_change(self, listener: Callable[[ModelStatus], None]) -> Callable[[], None]:
        """Call ``listener`` whenever the model that answers (or why) changes; returns what unsubscribes it."""
        self._model_listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._model_listeners:
                self._model_listeners.remove(listener)

        return unsubscribe

    def engine_health(self) -> dict[str, dict[str, object]]:
        """Each supervised engine's state and why (``/readyz``, the page)."""
        return {name: host.health.as_dict() for name, host in self.engines.items()}

    @property
    def degraded(self) -> bool:
        """Some supervised engine is not ready (restarting, or failed for good): calls are answered, worse."""
        return any(not host.health.ready for host in self.engines.values())

    async def close(self) -> None:
        if self._upgrade is not None:
            await self._upgrade.close()
        if self.tts is not None:
            await self.tts.close()
        for responder in {id(r): r for r in [self.responder, *self._responders.values()] if r}.values():
            aclose = getattr(responder, "aclose", None)
            if aclose is not None:
                await aclose()
        close_eot = getattr(self.end_of_turn, "close", None)  # Smart Turn's own worker thread
        if close_eot is not None:
            close_eot()
        close = getattr(self.asr, "close", None)  # the local runner's worker threads (a remote one has none)
        if close is not None:
            close()
        for host in self.engines.values():  # any child not closed with its engine above
            await host.close()


SERVICES: web.AppKey[Services] = web.AppKey("services", Services)
