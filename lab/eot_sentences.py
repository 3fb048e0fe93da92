"""The sentences of the end-of-turn corpus: English requests written from templates, deterministic from a seed.

A sentence is a list of segments; between two segments the speaker pauses mid-turn (the pause's kind says
where: after "and", "to", "the", inside a number, before a name, after a thinking "um", or after a clause that
already sounds finished, an afterthought). A sentence of one segment has no pause of its own (the voice's
commas and full stops still make short ones, which the evaluation counts as mid-turn pauses too).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

CITIES = ["Paris", "Tokyo", "Chicago", "Berlin", "Lisbon", "Denver", "Toronto", "Madrid", "Dublin", "Seattle",
          "Boston", "Vienna", "Oslo", "Austin", "Melbourne", "Nairobi", "Prague", "Phoenix", "Atlanta", "Zurich"]
DAYS = ["today", "tomorrow", "this weekend", "on Friday", "tonight", "on Monday", "next week", "this afternoon"]
NAMES = ["Anna", "David", "Maria", "James", "Sophie", "Michael", "Laura", "Peter", "Emma", "Daniel", "Olivia",
         "Thomas", "Grace", "Samuel", "Chloe", "Martin", "Rachel", "Kevin", "Helen", "Oscar"]
SURNAMES = ["Smith", "Garcia", "Miller", "Johnson", "Brown", "Wilson", "Taylor", "Clarke", "Lopez", "Walker"]
ROOMS = ["kitchen", "living room", "bedroom", "bathroom", "office", "hallway", "garage", "dining room"]
FOODS = ["a large pizza with mushrooms", "two chicken burritos", "a bowl of ramen", "a vegetable curry",
         "a cheeseburger with fries", "some sushi rolls", "a margherita pizza", "a Greek salad",
         "pad thai with tofu", "a turkey sandwich"]
ITEMS = ["eggs", "milk", "bread", "butter", "apples", "coffee", "rice", "cheese", "tomatoes", "onions", "pasta",
         "yogurt", "bananas", "orange juice", "olive oil", "chicken", "carrots", "tea", "honey", "flour"]
GENRES = ["jazz", "classical", "rock", "reggae", "hip hop", "country", "blues", "piano", "lo-fi", "folk"]
TASKS = ["call the dentist", "water the plants", "pick up the kids", "pay the rent", "buy a birthday card",
         "take out the trash", "book the car service", "send the report", "feed the cat", "renew my passport"]
PLACES = ["the airport", "the train station", "the nearest pharmacy", "the city library", "the museum",
          "the office", "the stadium", "the beach", "the hospital", "the shopping mall"]
STREETS = ["Maple", "Oak", "Pine", "Cedar", "Elm", "Lake", "Hill", "Park", "River", "Sunset", "Washington",
           "Highland"]
SUFFIXES = ["Street", "Avenue", "Road", "Drive", "Lane", "Boulevard"]
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SMALL = ["two", "three", "four", "five", "six", "seven", "eight", "ten", "twelve", "fifteen", "twenty", "thirty",
         "forty five", "ninety"]
HOURS = ["six", "seven", "eight", "nine", "ten", "eleven"]
MINUTES = ["fifteen", "thirty", "forty five", "twenty"]
THINGS = ["population", "capital", "history", "height", "meaning", "origin", "price", "size"]
TOPICS = ["the moon", "black holes", "the Roman empire", "volcanoes", "honey bees", "the ocean", "dinosaurs",
          "jazz music", "electric cars", "the pyramids"]
DEVICES = ["the lights", "the heater", "the fan", "the television", "the air conditioning", "the radio"]
STORES = ["bakery", "post office", "bank", "supermarket", "pharmacy", "hardware store", "gym", "library"]


@dataclass(frozen=True)
class Sentence:
    """One turn's words: ``segments`` spoken with a mid-turn pause of kind ``pauses[i]`` after segment i."""

    kind: str
    segments: tuple[str, ...]
    pauses: tuple[str, ...] = ()
    lang: str = "en"

    @property
    def text(self) -> str:
        return ("" if self.lang in ("ja", "zh") else " ").join(self.segments)


Template = Callable[[random.Random], Sentence]


def _c(r: random.Random, xs: list[str]) -> str:
    return r.choice(xs)


def _digits(r: random.Random, n: int) -> str:
    return " ".join(r.choice(DIGITS) for _ in range(n))


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# --- sentences without a pause of their own -------------------------------------------------------------------
def _question(r: random.Random) -> Sentence:
    forms = [
        lambda: f"What is the weather like in {_c(r, CITIES)} {_c(r, DAYS)}?",
        lambda: f"How long does it take to get to {_c(r, PLACES)}?",
        lambda: f"When does the {_c(r, STORES)} open {_c(r, DAYS)}?",
        lambda: f"Is it going to rain in {_c(r, CITIES)} {_c(r, DAYS)}?",
        lambda: f"What time is it in {_c(r, CITIES)} right now?",
        lambda: f"How many {_c(r, ['cups', 'grams', 'ounces', 'spoons'])} are in a "
                f"{_c(r, ['pound', 'liter', 'gallon', 'kilogram'])}?",
        lambda: f"Can you tell me something interesting about {_c(r, TOPICS)}?",
        lambda: f"Do I have any meetings {_c(r, DAYS)}?",
        lambda: f"Who is calling me from {_c(r, CITIES)}?",
        lambda: f"Where is the closest {_c(r, STORES)}?",
        lambda: f"What is the {_c(r, THINGS)} of {_c(r, CITIES)}?",
        lambda: f"Did {_c(r, NAMES)} send me a message {_c(r, DAYS)}?",
    ]
    return Sentence("question", (r.choice(forms)(),))


def _command(r: random.Random) -> Sentence:
    forms = [
        lambda: f"Set a timer for {_c(r, SMALL)} minutes.",
        lambda: f"Turn off {_c(r, DEVICES)} in the {_c(r, ROOMS)}.",
        lambda: f"Play some {_c(r, GENRES)} music in the {_c(r, ROOMS)}.",
        lambda: f"Remind me to {_c(r, TASKS)} {_c(r, DAYS)}.",
        lambda: f"Call {_c(r, NAMES)} {_c(r, SURNAMES)} on speaker.",
        lambda: f"Tell me a short story about {_c(r, TOPICS)}.",
        lambda: f"Send a message to {_c(r, NAMES)} saying I am running late.",
        lambda: f"Wake me up at {_c(r, HOURS)} {_c(r, MINUTES)} {_c(r, DAYS)}.",
        lambda: "Turn the volume down a little, please.",
        lambda: f"Book a table for {_c(r, SMALL[:6])} people at eight.",
        lambda: f"Order {_c(r, FOODS)} for delivery.",
        lambda: f"Read me the news about {_c(r, TOPICS)}.",
    ]
    return Sentence("command", (r.choice(forms)(),))


def _items(r: random.Random, n: int) -> list[str]:
    return r.sample(ITEMS, n)


def _list(r: random.Random) -> Sentence:
    a, b, c, d = _items(r, 4)
    forms = [
        lambda: f"Add {a}, {b} and {c} to my shopping list.",
        lambda: f"I need {a}, {b}, {c} and {d}.",
        lambda: f"Put {a} and {b} on the list for {_c(r, DAYS)}.",
        lambda: f"Buy {a}, {b}, and some {c}.",
    ]
    return Sentence("list", (r.choice(forms)(),))


def _number(r: random.Random) -> Sentence:
    forms = [
        lambda: f"My number is {_digits(r, 3)} {_digits(r, 4)}.",
        lambda: f"The code is {_digits(r, 6)}.",
        lambda: f"Transfer {_c(r, SMALL)} dollars to my savings account.",
        lambda: f"My flight number is {_digits(r, 4)}.",
        lambda: f"Dial {_digits(r, 3)} {_digits(r, 3)} {_digits(r, 4)}.",
    ]
    return Sentence("number", (r.choice(forms)(),))


def _street(r: random.Random) -> str:
    return f"{r.randint(2, 98)} {_c(r, STREETS)} {_c(r, SUFFIXES)}"


def _address(r: random.Random) -> Sentence:
    forms = [
        lambda: f"Navigate to {_street(r)}.",
        lambda: f"Send the package to {_street(r)} in {_c(r, CITIES)}.",
        lambda: f"How far is {_street(r)} from here?",
        lambda: f"Get me a taxi to {_street(r)}.",
    ]
    return Sentence("address", (r.choice(forms)(),))


# --- sentences with natural mid-turn pauses -------------------------------------------------------------------
def _after_and(r: random.Random) -> Sentence:
    a, b, c = _items(r, 3)
    forms = [
        lambda: (f"I need {a} and", f"{b} from the store."),
        lambda: (f"Book a flight to {_c(r, CITIES)} and", f"a hotel for {_c(r, SMALL[:5])} nights."),
        lambda: (f"Turn off {_c(r, DEVICES)} and", "lock the front door."),
        lambda: (f"Add {a}, {b} and", f"{c} to the list."),
        lambda: (f"Call {_c(r, NAMES)} and", "tell her I will be late."),
    ]
    return Sentence("pause_and", r.choice(forms)(), ("after_and",))


def _after_to(r: random.Random) -> Sentence:
    forms = [
        lambda: ("I want to", f"{_c(r, TASKS)} {_c(r, DAYS)}."),
        lambda: ("Send a message to", f"{_c(r, NAMES)} and say thanks."),
        lambda: ("How do I get to", f"{_c(r, PLACES)} from here?"),
        lambda: ("Remind me to", f"{_c(r, TASKS)}."),
        lambda: ("I would like to", f"order {_c(r, FOODS)}."),
        lambda: ("Change the temperature to", f"{_c(r, ['sixty eight', 'seventy', 'twenty one'])} degrees."),
    ]
    return Sentence("pause_to", r.choice(forms)(), ("after_to",))


def _after_the(r: random.Random) -> Sentence:
    forms = [
        lambda: ("Turn on the", f"lights in the {_c(r, ROOMS)}."),
        lambda: ("What is the", f"{_c(r, THINGS)} of {_c(r, CITIES)}?"),
        lambda: ("Open the", f"{_c(r, ['garage door', 'window blinds', 'calendar app', 'front gate'])}."),
        lambda: ("Where did I leave the", f"{_c(r, ['car keys', 'charger', 'remote', 'umbrella'])}?"),
        lambda: ("Play the", f"latest episode of my {_c(r, GENRES)} podcast."),
    ]
    return Sentence("pause_the", r.choice(forms)(), ("after_the",))


def _in_number(r: random.Random) -> Sentence:
    forms = [
        lambda: (f"My number is {_digits(r, 3)}", f"{_digits(r, 4)}."),
        lambda: (f"Set an alarm for {_c(r, HOURS)}", f"{_c(r, MINUTES)}."),
        lambda: (f"The confirmation code is {_digits(r, 3)}", f"{_digits(r, 3)}."),
        lambda: (f"Transfer {_c(r, SMALL)} hundred", f"and {_c(r, SMALL)} dollars."),
        lambda: (f"It is apartment {_digits(r, 2)}", f"{_digits(r, 1)} on the third floor."),
    ]
    return Sentence("pause_number", r.choice(forms)(), ("in_number",))


def _before_name(r: random.Random) -> Sentence:
    forms = [
        lambda: ("Please call", f"{_c(r, NAMES)} {_c(r, SURNAMES)}."),
        lambda: ("I have a meeting with", f"{_c(r, NAMES)} {_c(r, DAYS)}."),
        lambda: ("Send this photo to", f"{_c(r, NAMES)}."),
        lambda: ("Schedule lunch with", f"{_c(r, NAMES)} on Thursday."),
        lambda: ("What did", f"{_c(r, NAMES)} say about the trip?"),
    ]
    return Sentence("pause_name", r.choice(forms)(), ("before_name",))


def _um(r: random.Random) -> Sentence:
    forms = [
        lambda: ("I'd like to order, um,", f"{_c(r, FOODS)}."),
        lambda: ("Can you, um,", f"find me a {_c(r, STORES)} nearby?"),
        lambda: ("Set a reminder for, um,", f"{_c(r, DAYS)} at {_c(r, HOURS)}."),
        lambda: ("What's the weather in, uh,", f"{_c(r, CITIES)}?"),
        lambda: ("Play something, um,", f"{_c(r, GENRES)} maybe."),
    ]
    return Sentence("pause_um", r.choice(forms)(), ("um",))


def _afterthought(r: random.Random) -> Sentence:
    forms = [
        lambda: (f"What's the weather like {_c(r, DAYS)}?", f"In {_c(r, CITIES)}, I mean."),
        lambda: ("Play some music.", f"Something {_c(r, ['relaxing', 'upbeat', 'quiet', 'fast'])}."),
        lambda: (f"Set a timer for {_c(r, SMALL)} minutes.", "No, make it an hour."),
        lambda: (f"Call {_c(r, NAMES)}.", "On her mobile."),
        lambda: (f"Turn off {_c(r, DEVICES)}.", f"In the {_c(r, ROOMS)}."),
    ]
    return Sentence("pause_afterthought", r.choice(forms)(), ("afterthought",))


def _two_pauses(r: random.Random) -> Sentence:
    a, b = _items(r, 2)
    forms = [
        lambda: (("I need", f"{a} and", f"{b} for {_c(r, DAYS)}."), ("after_verb", "after_and")),
        lambda: ((f"My number is {_digits(r, 3)}", f"{_digits(r, 3)}", f"{_digits(r, 4)}."),
                 ("in_number", "in_number")),
        lambda: (("Remind me to", "um,", f"{_c(r, TASKS)}."), ("after_to", "um")),
        lambda: ((f"Navigate to {r.randint(2, 98)}", f"{_c(r, STREETS)} {_c(r, SUFFIXES)} in", f"{_c(r, CITIES)}."),
                 ("in_number", "before_name")),
    ]
    segs, kinds = r.choice(forms)()
    return Sentence("pause_two", segs, kinds)


# Kind → (template, weight). Half the turns have a pause written in, half are plain requests.
TEMPLATES: dict[str, tuple[Template, int]] = {
    "question": (_question, 8),
    "command": (_command, 8),
    "list": (_list, 4),
    "number": (_number, 4),
    "address": (_address, 4),
    "pause_and": (_after_and, 4),
    "pause_to": (_after_to, 4),
    "pause_the": (_after_the, 4),
    "pause_number": (_in_number, 4),
    "pause_name": (_before_name, 4),
    "pause_um": (_um, 4),
    "pause_afterthought": (_afterthought, 3),
    "pause_two": (_two_pauses, 3),
}


def make_sentences(n: int, seed: int) -> list[Sentence]:
    """``n`` distinct sentences, drawn from the templates by weight, the same for the same seed."""
    r = random.Random(f"eot-sentences-{seed}")
    kinds = list(TEMPLATES)
    weights = [TEMPLATES[k][1] for k in kinds]
    out: list[Sentence] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n:
            raise ValueError(f"the templates cannot make {n} distinct sentences")
        kind = r.choices(kinds, weights)[0]
        s = TEMPLATES[kind][0](r)
        s = Sentence(s.kind, tuple(_cap(x) if i == 0 else x for i, x in enumerate(s.segments)), s.pauses)
        if s.text.lower() in seen:
            continue
        seen.add(s.text.lower())
        out.append(s)
    return out


# --- Japanese (the Kokoro voices) -----------------------------------------------------------------------------
JA_CITIES = ["東京", "大阪", "京都", "札幌", "福岡", "名古屋", "横浜", "神戸", "仙台", "沖縄"]
JA_DAYS = ["今日", "明日", "週末", "金曜日", "今夜", "来週"]
JA_NAMES = ["田中さん", "佐藤さん", "鈴木さん", "高橋さん", "伊藤さん", "山本さん", "中村さん", "小林さん"]
JA_DIGITS = ["ゼロ", "いち", "に", "さん", "よん", "ご", "ろく", "なな", "はち", "きゅう"]
JA_FOODS = ["ラーメン", "お寿司", "カレー", "ピザ", "うどん", "焼き鳥"]
JA_ROOMS = ["リビング", "寝室", "台所", "玄関", "書斎"]
JA_ITEMS = ["牛乳", "卵", "パン", "りんご", "お米", "トマト", "バター", "お茶"]


def _ja_digits(r: random.Random, n: int) -> str:
    return "".join(r.choice(JA_DIGITS) for _ in range(n))


def _ja_plain(r: random.Random) -> Sentence:
    forms = [
        lambda: f"{_c(r, JA_DAYS)}の{_c(r, JA_CITIES)}の天気を教えてください。",
        lambda: f"{_c(r, JA_ROOMS)}の電気を消して。",
        lambda: f"{r.choice(['五', '十', '十五', '三十'])}分のタイマーをセットして。",
        lambda: f"{_c(r, JA_NAMES)}に電話して。",
        lambda: f"{_c(r, JA_CITIES)}までどのくらいかかりますか？",
        lambda: f"{_c(r, JA_FOODS)}の美味しいお店はどこですか？",
        lambda: f"買い物リストに{_c(r, JA_ITEMS)}と{_c(r, JA_ITEMS)}を追加して。",
    ]
    return Sentence("ja_plain", (r.choice(forms)(),), lang="ja")


def _ja_paused(r: random.Random) -> Sentence:
    forms = [
        lambda: ((f"{_c(r, JA_DAYS)}の、", f"{_c(r, JA_CITIES)}の天気を教えて。"), ("after_particle",)),
        lambda: ((f"電話番号は{_ja_digits(r, 3)}、", f"{_ja_digits(r, 4)}です。"), ("in_number",)),
        lambda: (("えーと、", f"{_c(r, JA_FOODS)}を注文したいです。"), ("um",)),
        lambda: ((f"{_c(r, JA_ITEMS)}と、", f"{_c(r, JA_ITEMS)}を買ってきて。"), ("after_and",)),
        lambda: (("明日の会議は、", f"{_c(r, JA_NAMES)}と一緒です。"), ("before_name",)),
        lambda: ((f"{_c(r, JA_ROOMS)}の電気を消して。", "あ、やっぱりつけて。"), ("afterthought",)),
    ]
    segs, kinds = r.choice(forms)()
    return Sentence("ja_pause", segs, kinds, lang="ja")


def make_sentences_ja(n: int, seed: int) -> list[Sentence]:
    """``n`` distinct Japanese sentences (half with a pause written in), the same for the same seed."""
    r = random.Random(f"eot-sentences-ja-{seed}")
    out: list[Sentence] = []
    seen: set[str] = set()
    for _ in range(200 * max(1, n)):
        if len(out) >= n:
            break
        s = (_ja_plain if r.random() < 0.5 else _ja_paused)(r)
        if s.text not in seen:
            seen.add(s.text)
            out.append(s)
    if len(out) < n:
        raise ValueError(f"the Japanese templates cannot make {n} distinct sentences")
    return out
