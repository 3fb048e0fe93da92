"""Text side of CosyVoice2: normalisation, sentence splitting, tags, instructions, token ids.

What the speech LLM expects as text:

- plain text to speak, normalised (numbers, dates, units spelled out; wetext for zh/en);
- optionally a language tag first, ``<|zh|> <|en|> <|ja|> <|yue|> <|ko|>`` (CosyVoice2's cross-lingual
  mode; the codes of the reference tokenizer's language table);
- in instruct mode, the instruction as the prompt text, ended by ``<|endofprompt|>``.

An emotion tag at the start of a text (``[关心] 你还好吗？``, ``[cheerful] Hello!``) is our convenience: it is
taken off the text and becomes the instruction (a small zh/en table; an unknown word is used as is).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from assistant.tts.tags import split_leading_tag
from assistant.tts.text import contains_chinese, split_sentences

if TYPE_CHECKING:  # transformers comes with the cosyvoice extra; imported where the tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

END_OF_PROMPT = "<|endofprompt|>"

# Our language codes (assistant.tts.base.LANGUAGES) → CosyVoice2's tags.
LANGUAGE_TAGS = {"zh": "<|zh|>", "en": "<|en|>", "ja": "<|ja|>", "yue": "<|yue|>", "ko": "<|ko|>"}

# Special tokens the CosyVoice2 tokenizer adds to Qwen's (they are single ids; the text normaliser must not
# touch them).
SPECIAL_TOKENS = (
    "<|im_start|>", "<|im_end|>", END_OF_PROMPT,
    "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]", "[cough]", "[clucking]", "[accent]",
    "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]", "[vocalized-noise]",
    "[lipsmack]", "[mn]",
)
_PARALINGUISTIC = {t[1:-1] for t in SPECIAL_TOKENS if t.startswith("[")}

# Emotion tag → instruction. zh instructions in CosyVoice2's own style ("用…的语气说"), en as a sentence.
EMOTIONS_ZH = {
    "开心": "用开心的语气说", "高兴": "用开心的语气说", "快乐": "用开心的语气说",
    "伤心": "用伤心的语气说", "难过": "用伤心的语气说", "悲伤": "用伤心的语气说",
    "生气": "用生气的语气说", "愤怒": "用生气的语气说",
    "关心": "用关心的语气说", "温柔": "用温柔的语气说", "平静": "用平静的语气说",
    "惊讶": "用惊讶的语气说", "兴奋": "用兴奋的语气说", "害怕": "用害怕的语气说",
    "严肃": "用严肃的语气说", "耳语": "用耳语的方式说",
}
EMOTIONS_EN = {
    "cheerful": "Speak in a cheerful, happy tone.", "happy": "Speak in a cheerful, happy tone.",
    "sad": "Speak in a sad tone.", "angry": "Speak in an angry tone.",
    "caring": "Speak in a caring, gentle tone.", "gentle": "Speak in a gentle tone.",
    "calm": "Speak in a calm tone.", "surprised": "Speak in a surprised tone.",
    "excited": "Speak in an excited tone.", "fearful": "Speak in a fearful tone.",
    "serious": "Speak in a serious tone.", "whisper": "Speak in a whisper.",
}

_LANG_TAG = re.compile(r"^\s*<\|(zh|en|ja|yue|ko)\|>")

# Sentence packing, as the reference sizes segments: aim for 60-80 units (characters for zh, tokens or words
# for other languages), and glue a trailing piece shorter than 20 units to the one before.
SENTENCE_MAX = 80
SENTENCE_MIN = 60
SENTENCE_MERGE = 20
# The reference cuts after every one of these and drops a mark that directly follows another, so a run
# ("...", "?!") keeps its first mark; and it ends a text that has no final mark with one.
_ZH_STOPS = "。？！；：、.?!;"
_EN_STOPS = ".?!;:"
_MARK_RUN = {lang: re.compile(f"([{re.escape(stops)}])[{re.escape(stops)}]+") for lang, stops in
             (("zh", _ZH_STOPS), ("en", _EN_STOPS))}
_CLOSERS = "\"”'’)）」』"


def language_tag(language: str | None) -> str:
    """``"ja"`` → ``"<|ja|>"``; None or "" → ""; an unknown code raises ValueError."""
    if not language:
        return ""
    try:
        return LANGUAGE_TAGS[language]
    except KeyError:
        raise ValueError(f"unsupported language {language!r}; use one of {', '.join(LANGUAGE_TAGS)}") from None


def format_instruct(instruct: str) -> str:
    """The prompt text of instruct mode: ``{instruct}<|endofprompt|>`` (added once)."""
    instruct = instruct.strip()
    return instruct if instruct.endswith(END_OF_PROMPT) else instruct + END_OF_PROMPT


def emotion_instruction(word: str) -> str:
    """Map an emotion word to an instruction; unknown words become the instruction themselves."""
    word = word.strip()
    if word in EMOTIONS_ZH:
        return EMOTIONS_ZH[word]
    if word.lower() in EMOTIONS_EN:
        return EMOTIONS_EN[word.lower()]
    return word


def split_emotion_tag(text: str) -> tuple[str | None, str]:
    """``"[关心] 你还好吗"`` → ``("用关心的语气说", "你还好吗")``; no tag → ``(None, text)``.

    CosyVoice2's own bracket tokens (``[breath]``, ``[laughter]``, ...) are sounds, not emotions: kept.
    """
    tag, rest = split_leading_tag(text)
    if tag is None or tag.lower() in _PARALINGUISTIC:
        return None, text
    return emotion_instruction(tag), rest


# --- normalisation -------------------------------------------------------------------------------------------


class Normalizer(Protocol):
    """A wetext ``Normalizer`` as it is used here (wetext ships no type hints)."""

    def normalize(self, text: str) -> str: ...


class _Normalizers:
    """wetext normalisers, created on first use; absent wetext is logged once and skipped."""

    def __init__(self) -> None:
        self._made = False
        self.zh: Normalizer | None = None
        self.en: Normalizer | None = None

    def get(self) -> tuple[Normalizer | None, Normalizer | None]:
        if not self._made:
            self._made = True
            try:
                from wetext import Normalizer

                self.zh = Normalizer(lang="zh", operator="tn", remove_erhua=False)
                self.en = Normalizer(lang="en", operator="tn")
            except Exception as exc:  # ImportError, or missing FST resources
                log.warning("wetext unavailable, text normalisation skipped (numbers stay digits): error=%r", exc)
        return self.zh, self.en


def _zh_cleanup(text: str) -> str:
    """Reference zh clean-up after TN: no newlines, no blanks between CJK, ²/³ spelled, brackets dropped."""
    text = text.replace("\n", "")
    text = re.sub(r"(?<![A-Za-z0-9]) | (?![A-Za-z0-9])", "", text)  # keep blanks only between ascii words
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。").replace(" - ", "，")
    for ch in ("（", "）", "【", "】", "`"):
        text = text.replace(ch, "")
    text = text.replace("——", " ")
    return re.sub(r"[，,、]+$", "。", text)


def _is_only_punctuation(text: str) -> bool:
    return not any(ch.isalnum() for ch in text)


@dataclass
class TextFrontend:
    """Normalise, split and tokenise text for the speech LLM.

    ``tokenizer_dir`` is ``CosyVoice-BlankEN`` (Qwen2 tokenizer files). Without it (the tiny test model),
    ``encode`` is unavailable and callers pass token ids themselves.
    """

    tokenizer_dir: Path | None = None
    normalize_text: bool = True

    def __post_init__(self) -> None:
        self._normalizers = _Normalizers()
        self._tokenizer: PreTrainedTokenizerBase | None = None

    @property
    def normalizes(self) -> bool:
        """Whether numbers, dates etc. are spelled out (wetext importable and ``normalize_text`` on)."""
        zh, en = self._normalizers.get()
        return self.normalize_text and zh is not None and en is not None

    # tokens
    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer_dir is not None

    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            if self.tokenizer_dir is None:
                raise RuntimeError("no tokenizer: the model directory has no CosyVoice-BlankEN tokenizer files")
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(self.tokenizer_dir), local_files_only=True)
            tok.add_special_tokens(
                {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                 "additional_special_tokens": list(SPECIAL_TOKENS)}
            )
            self._tokenizer = tok
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        """Text (special tokens allowed) → Qwen2 token ids."""
        return list(self.tokenizer()(text)["input_ids"])

    def _length(self, text: str, lang: str) -> int:
        if lang == "zh":
            return len(text)
        if self._tokenizer is not None or self.has_tokenizer:
            try:
                return len(self.encode(text))
            except Exception:  # a broken tokenizer dir: fall back to words
                pass
        return len(text.split())

    # normalisation
    def normalize(self, text: str) -> str:
        """Spell out numbers etc. (wetext), with the reference's zh clean-up. Tagged text is left alone."""
        text = text.strip()
        if not text or not self.normalize_text or ("<|" in text and "|>" in text):
            return text
        zh, en = self._normalizers.get()
        if contains_chinese(text):
            if zh is not None:
                text = zh.normalize(text)
            return _zh_cleanup(text)
        if en is not None:
            text = en.normalize(text)
        return text

    def split(self, text: str) -> list[str]:
        """Split into segments of about 60-80 units; pieces of pure punctuation are dropped.

        Sentences come from the one splitter (:func:`assistant.tts.text.split_sentences`); they are packed as
        the reference packs its pieces, and, like the reference's, keep the blank that preceded them
        (``" You have..."``: the blank is a token of its own). The reference cuts at every mark, also after
        ``Dr.``, inside an unnormalised ``3.5``, at ``:`` and ``、``; the splitter does not, which changes a
        segment only where the 60-80 packing would have cut at such a mark (none of the reference's ten texts).
        """
        text = text.strip()
        if not text:
            return []
        lang = "zh" if contains_chinese(text) else "en"
        stops = _ZH_STOPS if lang == "zh" else _EN_STOPS
        text = _MARK_RUN[lang].sub(r"\1", text)
        if text[-1] not in stops and text[-1] not in _CLOSERS:
            text += "。" if lang == "zh" else "."
        out: list[str] = []
        cur = ""
        for piece in split_sentences(text):
            if self._length(cur + piece, lang) > SENTENCE_MAX and self._length(cur, lang) > SENTENCE_MIN:
                out.append(cur)
                cur = ""
            cur += piece
        if cur:
            if out and self._length(cur, lang) < SENTENCE_MERGE:
                out[-1] += cur
            else:
                out.append(cur)
        return [s for s in out if not _is_only_punctuation(s)]

    def sentences(self, text: str) -> list[str]:
        """Normalise, then split (what the synthesiser runs one by one)."""
        return self.split(self.normalize(text))


@dataclass(frozen=True)
class PreparedText:
    """A request's text after tags are resolved: what to speak and what to put in the prompt-text slot."""

    text: str
    instruct: str | None  # already formatted with <|endofprompt|>, or None


def prepare_text(text: str, instruct: str | None = None, language: str | None = None) -> PreparedText:
    """Resolve an emotion tag, an explicit instruction and a language tag into text + formatted instruction.

    An explicit ``instruct`` wins over an emotion tag (the tag is still removed from the text).
    """
    tag_instruct, text = split_emotion_tag(text)
    chosen = instruct if instruct else tag_instruct
    tag = language_tag(language)
    if tag and not _LANG_TAG.match(text):
        text = tag + text
    return PreparedText(text=text, instruct=format_instruct(chosen) if chosen else None)


__all__ = [
    "END_OF_PROMPT",
    "LANGUAGE_TAGS",
    "SPECIAL_TOKENS",
    "PreparedText",
    "TextFrontend",
    "emotion_instruction",
    "format_instruct",
    "language_tag",
    "prepare_text",
    "split_emotion_tag",
]
