"""``python -m lab STUDY …``: the team's studies on the command line (``python -m lab --help`` lists them).

Each study's flags live in its module; only the chosen study's module is imported.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import sys
from collections.abc import Sequence

# name, help, module, function adding its flags, function running it (async or not)
STUDIES: tuple[tuple[str, str, str, str, str], ...] = (
    ("eot-corpus", "write the end-of-turn evaluation set (a tuning and a held-out half) from a seed",
     "lab.eot_corpus", "add_corpus_arguments", "run_corpus"),
    ("eot", "end-of-turn policies on the corpus: per-pause evidence (VAD, Smart Turn, ASR), tuning on one half, "
     "the trade-off curve on the held-out half", "lab.eot", "add_eot_arguments", "run_eot"),
    ("confirm", "when a decided end's reply may be heard: turn.confirm_sure and confirm_sure_ms swept on the eot "
     "evidence against the false starts a caller would hear, on a machine as fast as any and on this one",
     "lab.confirm", "add_confirm_arguments", "run_confirm"),
    ("phone-plan", "turn.phone_plan replayed on the eot evidence: the numbers a plan answers sooner against the "
     "pauses it cuts and the false starts a caller would hear", "lab.phone_plan", "add_phone_plan_arguments",
     "run_phone_plan"),
    ("hearing", "the human set (a tuning set) through tiny.en and base+auto: how often each slot's words are in the "
     "transcript, and the language detected at every pass", "lab.hearing", "add_hearing_arguments", "run_hearing"),
    ("languages", "the price of hearing every language on a CPU: ASR time of base+auto against tiny.en+en on the "
     "same English turns, and v2v at one session with asr.language auto (and en)", "lab.asr_languages",
     "add_languages_arguments", "run_languages"),
    ("narrowband", "ASR word error on the test speech at 16 kHz vs through a phone line (8 kHz μ-law)",
     "lab.narrowband", "add_narrowband_arguments", "run_narrowband"),
    ("features", "voice-to-voice with each latency feature on and off, vs a baseline",
     "lab.latency_features", "add_features_arguments", "run_features"),
    ("ray", "v2v of one process vs gateways sharing engines through Ray Serve, and the hop's cost",
     "lab.ray_hop", "add_ray_arguments", "run_ray_bench"),
    ("attacks", "hostile clients against a real server: answers, RSS, event-loop lag, a bystander's turn "
     "(--before DIR: the same against another checkout)", "lab.attack_bench", "add_attack_arguments",
     "run_attack_bench"),
    ("isolation", "the embedded model in this process vs in its supervised child process: voice to voice at each "
     "level, memory, and a crash's time to the next answer", "lab.isolation", "add_isolation_arguments",
     "run_isolation_bench"),
    ("replies", "are the replies worth hearing: requests through the responder the calls use, scored per category "
     "(answered, speakable, short, no role reversal, right, language), before and after in one run",
     "lab.replies", "add_replies_arguments", "run_replies_bench"),
    ("doubt", "honest doubt: simple facts through the bundled model, each first sentence scored as the gate scores "
     "it; the thresholds that lose no right answer on the tuning requests", "lab.doubt", "add_doubt_arguments",
     "run_doubt"),
    ("first-piece", "a CPU voice's first chunk against the length of a reply's first piece, and the part no "
     "shorter piece saves", "lab.first_piece", "add_first_piece_arguments", "run_first_piece"),
    ("phrase-breaks", "a long clause cut before a joining word (chunker.reply_phrase_break_ms): the model's "
     "replies replayed at measured token paces through the chunker and a piece-by-piece voice; first audio and "
     "the silences inside", "lab.phrase_breaks", "add_phrase_break_arguments", "run_phrase_breaks"),
    ("speech-ends", "where the server says the speech ended (the turn's speech_end mark) against labelled ends, "
     "the audible floor swept: tuned on the human set's tuning half, reported on its held-out half",
     "lab.speech_ends", "add_speech_ends_arguments", "run_speech_ends"),
    ("asr-threads", "an ASR pass on 1, 2, ... CTranslate2 threads: alone (wall and CPU) and two at once, on the "
     "held-out human clips, thread counts interleaved", "lab.asr_threads", "add_threads_arguments", "run_threads"),
    ("telemetry-cost", "three servers (telemetry off, on with a live receiver, on with a dead endpoint) and their "
     "v2v in one run", "lab.telemetry_cost", "add_arguments", "run_cli"),
)
# The offline GPU check has a command line of its own (scripts/gpu_check.sh runs it on a lent machine).
GPU_CHECK = "gpu-check"


def _choice(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--log-level":
            continue
        if i > 0 and argv[i - 1] == "--log-level":
            continue
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(study: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab", description="The team's studies (lab/__init__.py).")
    parser.add_argument("--log-level", default="WARNING", help="log level while the study runs")
    sub = parser.add_subparsers(dest="study", required=True)
    for name, helptext, module, adder, _ in STUDIES:
        p = sub.add_parser(name, help=helptext)
        if study is not None and study != name:
            continue
        getattr(importlib.import_module(module), adder)(p)
    sub.add_parser(GPU_CHECK, help="the offline GPU check (python -m lab.gpu_check --help; scripts/gpu_check.sh)",
                   add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    study = _choice(argv)
    if study == GPU_CHECK:
        from lab.gpu_check import main as gpu_main

        return gpu_main(argv[argv.index(GPU_CHECK) + 1:])
    args = build_parser(study).parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    for name, _, module, _, runner in STUDIES:
        if name == args.study:
            result = getattr(importlib.import_module(module), runner)(args)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
            return int(result or 0)
    return 2


if __name__ == "__main__":
    sys.exit(main())
