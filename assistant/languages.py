"""Language codes: the one table every part checks a language against (ASR, the reply, the voice, the APIs).

The codes are Whisper's (ISO 639-1 where there is one, ``haw``, ``yue``), with their English names; ``auto``
asks the ASR to detect the language of each turn. :func:`script_language` guesses a text's language from its
script, for turns whose words were typed, not heard (no ASR to say).
"""

from __future__ import annotations

AUTO = "auto"

# Whisper's language table (large-v3 and later; earlier multilingual models lack "yue"), code → English name.
NAMES: dict[str, str] = {
    "en": "English", "zh": "Chinese", "de": "German", "es": "Spanish", "ru": "Russian", "ko": "Korean",
    "fr": "French", "ja": "Japanese", "pt": "Portuguese", "tr": "Turkish", "pl": "Polish", "ca": "Catalan",
    "nl": "Dutch", "ar": "Arabic", "sv": "Swedish", "it": "Italian", "id": "Indonesian", "hi": "Hindi",
    "fi": "Finnish", "vi": "Vietnamese", "he": "Hebrew", "uk": "Ukrainian", "el": "Greek", "ms": "Malay",
    "cs": "Czech", "ro": "Romanian", "da": "Danish", "hu": "Hungarian", "ta": "Tamil", "no": "Norwegian",
    "th": "Thai", "ur": "Urdu", "hr": "Croatian", "bg": "Bulgarian", "lt": "Lithuanian", "la": "Latin",
    "mi": "Maori", "ml": "Malayalam", "cy": "Welsh", "sk": "Slovak", "te": "Telugu", "fa": "Persian",
    "lv": "Latvian", "bn": "Bengali", "sr": "Serbian", "az": "Azerbaijani", "sl": "Slovenian", "kn": "Kannada",
    "et": "Estonian", "mk": "Macedonian", "br": "Breton", "eu": "Basque", "is": "Icelandic", "hy": "Armenian",
    "ne": "Nepali", "mn": "Mongolian", "bs": "Bosnian", "kk": "Kazakh", "sq": "Albanian", "sw": "Swahili",
    "gl": "Galician", "mr": "Marathi", "pa": "Punjabi", "si": "Sinhala", "km": "Khmer", "sn": "Shona",
    "yo": "Yoruba", "so": "Somali", "af": "Afrikaans", "oc": "Occitan", "ka": "Georgian", "be": "Belarusian",
    "tg": "Tajik", "sd": "Sindhi", "gu": "Gujarati", "am": "Amharic", "yi": "Yiddish", "lo": "Lao",
    "uz": "Uzbek", "fo": "Faroese", "ht": "Haitian Creole", "ps": "Pashto", "tk": "Turkmen", "nn": "Nynorsk",
    "mt": "Maltese", "sa": "Sanskrit", "lb": "Luxembourgish", "my": "Myanmar", "bo": "Tibetan",
    "tl": "Tagalog", "mg": "Malagasy", "as": "Assamese", "tt": "Tatar", "haw": "Hawaiian", "ln": "Lingala",
    "ha": "Hausa", "ba": "Bashkir", "jw": "Javanese", "su": "Sundanese", "yue": "Cantonese",
}
CODES = frozenset(NAMES)
# What people write for a language and Whisper spells otherwise: a hint in the error message.
_ALIASES = {"jp": "ja", "cn": "zh", "zh-cn": "zh", "zh-tw": "zh", "cmn": "zh", "kr": "ko", "gr": "el",
            "iw": "he", "jv": "jw", "se": "sv", "dk": "da", "ua": "uk", "cz": "cs", "english": "en",
            "chinese": "zh", "japanese": "ja", "korean": "ko", "cantonese": "yue", "mandarin": "zh"}


class UnknownLanguage(ValueError):
    """A language code no table here knows; the message says which codes are known, ``problem`` only what is
    wrong with this one (for an API's short answer)."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


def name(code: str) -> str:
    """``"ja"`` → ``"Japanese"`` (the code itself for one not in the table)."""
    return NAMES.get(code, code)


def check(code: str, where: str, *, auto: bool = False) -> str:
    """``code`` if it is a known language code (or ``auto`` where ``auto`` is allowed), else
    :class:`UnknownLanguage` naming ``where`` the value came from and what it may be."""
    if code in CODES or (auto and code == AUTO):
        return code
    hint = _ALIASES.get(code.strip().lower())
    did_you_mean = f"; did you mean {hint!r}?" if hint else ""
    allowed = f"'{AUTO}' or " if auto else ""
    problem = f"{code!r} is not a language code{did_you_mean}"
    raise UnknownLanguage(
        f"{where}: {problem} Use {allowed}one of Whisper's codes, e.g. en, zh, ja, ko, yue, de, fr, es (all: "
        f"{', '.join(sorted(CODES))})", problem)


def script_language(text: str) -> str | None:
    """The language a text's script gives away: kana → ``ja``, Hangul → ``ko``, Han alone → ``zh``; None for
    anything else (Latin script says nothing about the language)."""
    han = False
    for ch in text:
        o = ord(ch)
        if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9F:
            return "ja"
        if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
            return "ko"
        if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF:
            han = True
    return "zh" if han else None
