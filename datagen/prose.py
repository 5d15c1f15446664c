"""Generated English prose: short stories, descriptions and arithmetic from a small template grammar.

The standard library gives the corpus real code and technical English; this adds plain narrative
English with simple, consistent world facts, in the spirit of bAbI's stories (people move between
places, pick objects up and hand them over) and of the counting/addition the scattered-clue "sum"
task asks for. Every word comes from the lists below, so a tiny model can learn the language quickly.

`generate_document(rng)` returns one document of a few paragraphs; the same generator state gives the
same text.
"""

from __future__ import annotations

import numpy as np

PEOPLE = (
    "Mary", "John", "Sandra", "Daniel", "Ana", "Ben", "Lena", "Omar", "Yuki", "Priya", "Tom",
    "Fatima", "Ivan", "Chloe", "Marco", "Grace", "Hugo", "Nina", "Sam", "Zoe",
)
PLACES = (
    "kitchen", "garden", "hallway", "office", "bedroom", "bathroom", "library", "station",
    "market", "park", "harbor", "school", "bakery", "museum", "workshop",
)
OBJECTS = (
    "apple", "book", "key", "ball", "cup", "lamp", "letter", "map", "box", "pencil", "coin",
    "hat", "bottle", "clock", "shell",
)
COLORS = ("red", "green", "blue", "yellow", "white", "black", "orange", "purple", "gray", "brown")
ANIMALS = ("cat", "dog", "fox", "owl", "horse", "rabbit", "goat", "duck", "mouse", "bear")
FOODS = ("bread", "rice", "soup", "fish", "cheese", "berries", "carrots", "honey", "seeds", "nuts")
ADJECTIVES = ("small", "large", "quiet", "busy", "old", "new", "bright", "dark", "warm", "cold")
WEATHER = ("sunny", "rainy", "windy", "cloudy", "foggy", "snowy")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve",
)


def _pick(rng: np.random.Generator, words: tuple[str, ...]) -> str:
    return words[int(rng.integers(len(words)))]


def _story(rng: np.random.Generator) -> str:
    """A bAbI-style story: each step is consistent with where people are and what they hold."""
    people = [str(p) for p in rng.choice(PEOPLE, size=int(rng.integers(2, 4)), replace=False)]
    where = {p: _pick(rng, PLACES) for p in people}
    holding: dict[str, list[str]] = {p: [] for p in people}
    sentences = [f"On {_pick(rng, DAYS)} it was {_pick(rng, WEATHER)}."]
    for p in people:
        sentences.append(f"{p} was in the {where[p]}.")
    for _ in range(int(rng.integers(4, 10))):
        p = people[int(rng.integers(len(people)))]
        action = int(rng.integers(4))
        if action == 0:
            place = _pick(rng, PLACES)
            verb = _pick(rng, ("went to", "walked to", "moved to", "travelled to"))
            sentences.append(f"{p} {verb} the {place}.")
            where[p] = place
        elif action == 1:
            obj = _pick(rng, OBJECTS)
            sentences.append(f"{p} picked up the {obj} in the {where[p]}.")
            holding[p].append(obj)
        elif action == 2 and holding[p]:
            obj = holding[p].pop(0)
            sentences.append(f"{p} put down the {obj}.")
        else:
            others = [q for q in people if q != p and where[q] == where[p]]
            if others and holding[p]:
                q, obj = others[0], holding[p].pop()
                sentences.append(f"{p} gave the {obj} to {q}.")
                holding[q].append(obj)
            else:
                sentences.append(f"{p} stayed in the {where[p]} for a while.")
    p = people[int(rng.integers(len(people)))]
    sentences.append(f"In the end {p} was in the {where[p]}.")
    return " ".join(sentences)


def _description(rng: np.random.Generator) -> str:
    animal, color, food = _pick(rng, ANIMALS), _pick(rng, COLORS), _pick(rng, FOODS)
    place, adj = _pick(rng, PLACES), _pick(rng, ADJECTIVES)
    n = int(rng.integers(2, len(NUMBER_WORDS)))
    return " ".join(
        [
            f"The {color} {animal} lives near the {adj} {place}.",
            f"It likes to eat {food} in the morning.",
            f"There are {NUMBER_WORDS[n]} {animal}s in the {place}, and the {color} one is the oldest.",
            f"When it is {_pick(rng, WEATHER)}, the {animal}s stay inside.",
        ]
    )


def _arithmetic(rng: np.random.Generator) -> str:
    p, obj = _pick(rng, PEOPLE), _pick(rng, OBJECTS)
    a, b = int(rng.integers(0, 10)), int(rng.integers(0, 10))
    c, d = int(rng.integers(0, 10)), int(rng.integers(0, 10))
    return " ".join(
        [
            f"{p} had {a} {obj}s and found {b} more, so {p} had {a + b} {obj}s.",
            f"{c} plus {d} is {c + d}.",
            f"If you add {NUMBER_WORDS[min(c, 12)]} and {NUMBER_WORDS[min(d, 12)]} you get {c + d}.",
        ]
    )


_PARAGRAPHS = (_story, _description, _arithmetic)


def generate_document(rng: np.random.Generator) -> str:
    """A document of 2-5 paragraphs of generated prose, separated by blank lines."""
    paragraphs = []
    for _ in range(int(rng.integers(2, 6))):
        make = _PARAGRAPHS[int(rng.integers(len(_PARAGRAPHS)))]
        paragraphs.append(make(rng))
    return "\n\n".join(paragraphs)
