"""What ``voice`` and ``speaker_wav`` may name, and where each name leads.

A name is, in this order: a registered voice's id or name (:class:`ReferenceClipStore`), one of the engine's own
voices, or the file name of a reference clip in the voices folder (``tts_api.voices_dir``). Files are looked
up only inside that folder: a name with ``..`` or an absolute path is refused, and a symlink that resolves to
a place outside the folder is refused too. A name that leads nowhere gets a 400 that lists what exists.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from assistant.server.tts_api.request import TTSError, bad_field
from assistant.tts.base import TTSEngine
from assistant.tts.voice_store import ReferenceClipStore, valid_voice_id

log = logging.getLogger(__name__)

AUDIO_SUFFIXES = (".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a", ".aac", ".webm")
TRANSCRIPT_SUFFIX = ".txt"              # ``ref.txt`` next to ``ref.wav``: what the clip says
MAX_TRANSCRIPT_BYTES = 16_384
LISTED_NAMES = 20                       # names an "unknown voice" error lists per kind at most
FILE_VOICE_PREFIX = "file-"


@dataclass(frozen=True)
class NamedVoice:
    """Where a name led: a stored voice, one of the engine's voices, or a clip file in the voices folder."""

    kind: str                # "stored", "engine" or "file"
    voice_id: str            # stored: its id; engine: the engine's name for it; file: a key for the engine
    path: Path | None = None  # file: the resolved clip


def engine_voice_names(engine: TTSEngine) -> list[str]:
    """The voices an engine speaks without cloning: ``default`` and whatever names it declares."""
    names = ["default"]
    own = getattr(engine, "voice_name", None)
    if isinstance(own, str) and own:
        names.append(own)
    listed = getattr(engine, "voices", None)
    if isinstance(listed, list | tuple | set | frozenset):
        names += [v for v in listed if isinstance(v, str)]
    return list(dict.fromkeys(names))


class VoiceFolder:
    """Reference clips an operator put in ``tts_api.voices_dir``, found by file name and never outside it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def find(self, name: str, field: str) -> Path | None:
        """The clip ``name`` names, or None if there is none; 400 if the name tries to leave the folder."""
        rel = PurePosixPath(name.replace("\\", "/"))
        if rel.is_absolute() or name.startswith("~") or (len(name) > 1 and name[1] == ":"):
            raise bad_field(field, f"{name!r}: a file name must be relative to the voices folder, not absolute")
        if ".." in rel.parts:
            raise bad_field(field, f"{name!r}: a file name may not contain '..'")
        if rel.suffix.lower() not in AUDIO_SUFFIXES or not self.root.is_dir():
            return None
        root = self.root.resolve()
        path = (root / rel).resolve()  # follows every symlink on the way
        if not path.is_relative_to(root):
            log.warning("voice_file_refused reason=symlink_out name_chars=%d", len(name))
            raise bad_field(field, f"{name!r} leads outside the voices folder (a symlink); it is not read")
        return path if path.is_file() else None

    def names(self) -> list[str]:
        """Clip files in the folder (top level and one level down), sorted; at most a few hundred looked at."""
        if not self.root.is_dir():
            return []
        root = self.root.resolve()
        out: list[str] = []
        for pattern in ("*", "*/*"):
            for path in sorted(self.root.glob(pattern))[:500]:
                if path.suffix.lower() in AUDIO_SUFFIXES and path.resolve().is_relative_to(root) and path.is_file():
                    out.append(path.relative_to(self.root).as_posix())
        return out

    def transcript(self, clip: Path) -> str:
        """The text of ``<clip stem>.txt`` next to the clip, if it exists inside the folder; else ""."""
        side = clip.with_suffix(TRANSCRIPT_SUFFIX)
        try:
            inside = side.resolve().is_relative_to(self.root.resolve())
            if inside and side.is_file() and side.stat().st_size <= MAX_TRANSCRIPT_BYTES:
                return side.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            pass
        return ""


def file_voice_key(content_digest: str, transcript: str) -> str:
    """An engine voice id for a clip file: what the clip holds (its bytes' digest) and what its own ``.txt`` says.
    Never a request's ``prompt_text``: a client that sends a new text each time must not make the engine prepare
    the same clip again (and push other voices out)."""
    raw = f"{content_digest}\0{transcript}".encode()
    return FILE_VOICE_PREFIX + hashlib.sha256(raw).hexdigest()[:16]


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve_name(name: str, field: str, store: ReferenceClipStore, engine: TTSEngine,
                 folder: VoiceFolder) -> NamedVoice:
    """Where ``name`` leads (see the module docstring); 400 ``unknown_voice`` listing what exists."""
    if valid_voice_id(name) and store.get(name) is not None:
        return NamedVoice("stored", name)
    stored = [v for v in store.list() if v.name.casefold() == name.casefold()]
    if len(stored) > 1:
        ids = ", ".join(v.voice_id for v in stored)
        raise bad_field(field, f"{len(stored)} voices are named {name!r} ({ids}); give the voice_id instead")
    if stored:
        return NamedVoice("stored", stored[0].voice_id)
    if name in engine_voice_names(engine):
        return NamedVoice("engine", name)
    path = folder.find(name, field)
    if path is not None:
        return NamedVoice("file", "", path)
    raise TTSError(400, "unknown_voice", f"field '{field}': no voice or file named {name!r}; "
                   + describe_choices(store, engine, folder), param=field)


def describe_choices(store: ReferenceClipStore, engine: TTSEngine, folder: VoiceFolder) -> str:
    """What exists, for error messages: registered voices, the engine's voices, files in the voices folder."""

    def some(items: list[str]) -> str:
        if not items:
            return "none"
        more = f" (and {len(items) - LISTED_NAMES} more)" if len(items) > LISTED_NAMES else ""
        return ", ".join(repr(i) for i in items[:LISTED_NAMES]) + more

    registered = [f"{v.name} ({v.voice_id})" for v in store.list()]
    return (f"registered voices: {some(registered)}; engine {engine.name} voices: "
            f"{some(engine_voice_names(engine))}; files in the voices folder: {some(folder.names())}")
