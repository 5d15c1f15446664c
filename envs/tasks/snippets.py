"""Small reference functions the coding tasks are built from, each with bugs to plant and inputs.

A `Snippet` is a correct function (signature, one-line docstring, body), a list of bugs as exact
text replacements in the body, and a generator of random arguments. Expected test values are never
written by hand: `expected()` runs the correct code (our own, trusted) on the generated arguments.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Snippet:
    name: str
    params: str
    doc: str
    body: str
    bugs: tuple[tuple[str, str], ...]
    args: Callable[[random.Random], tuple]
    module: str  # which utility module it lives in

    def source(self, body: str | None = None) -> str:
        return f'def {self.name}({self.params}):\n    """{self.doc}"""\n{body if body is not None else self.body}'

    def stub(self) -> str:
        return self.source("    return None\n")

    def buggy(self, k: int) -> str:
        old, new = self.bugs[k]
        assert old in self.body, (self.name, old)
        return self.source(self.body.replace(old, new, 1))

    def function(self, source: str | None = None) -> Callable:
        ns: dict[str, Any] = {}
        exec(source or self.source(), ns)  # noqa: S102 - our own template code, not agent code
        return ns[self.name]


def _words(rng: random.Random, pool: list[str], lo: int, hi: int) -> str:
    return " ".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))


SNIPPETS = [
    Snippet("clamp", "x, lo, hi", "Return x limited to the range [lo, hi].",
            "    return max(lo, min(x, hi))\n",
            (("min(x, hi)", "min(x, lo)"), ("max(lo, ", "min(lo, ")),
            lambda r: (r.randint(-20, 20), r.randint(-10, 0), r.randint(1, 10)), "mathutils"),
    Snippet("mean", "xs", "Return the arithmetic mean of xs, or 0.0 for an empty list.",
            "    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)\n",
            (("/ len(xs)", "/ (len(xs) + 1)"),),
            lambda r: ([r.randint(-50, 50) for _ in range(r.randint(0, 6))],), "mathutils"),
    Snippet("gcd", "a, b", "Return the greatest common divisor of two non-negative integers.",
            "    while b:\n        a, b = b, a % b\n    return a\n",
            (("return a", "return b"), ("while b:", "if b:")),
            lambda r: (r.randint(0, 200), r.randint(1, 200)), "mathutils"),
    Snippet("median", "xs", "Return the median of a non-empty list of numbers.",
            "    s = sorted(xs)\n    m = len(s) // 2\n    if len(s) % 2:\n        return s[m]\n"
            "    return (s[m - 1] + s[m]) / 2\n",
            (("(s[m - 1] + s[m]) / 2", "s[m]"), ("s = sorted(xs)", "s = list(xs)")),
            lambda r: ([r.randint(-20, 20) for _ in range(r.randint(1, 7))],), "mathutils"),
    Snippet("digit_sum", "n", "Return the sum of the decimal digits of a non-negative integer.",
            "    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total\n",
            (("total += n % 10", "total += n % 9"), ("n //= 10", "n //= 100")),
            lambda r: (r.randint(0, 99999),), "mathutils"),
    Snippet("is_palindrome", "s",
            "Return True if s reads the same backwards, ignoring case and non-alphanumeric characters.",
            "    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
            (("c.lower()", "c"), (" if c.isalnum()", "")),
            lambda r: (r.choice(["Racecar", "A man, a plan, a canal: Panama", "hello", "Was it a car or a cat I saw?",
                                 "No lemon, no melon", "python", "Step on no pets", "abcba", "abca", "Noon"]),),
            "textutils"),
    Snippet("count_words", "text", "Return a dict mapping each lower-cased word of text to its count.",
            "    counts = {}\n    for w in text.lower().split():\n        counts[w] = counts.get(w, 0) + 1\n"
            "    return counts\n",
            (("text.lower().split()", "text.split()"), ("counts.get(w, 0) + 1", "1")),
            lambda r: (_words(r, ["the", "cat", "The", "dog", "a", "Cat", "runs"], 1, 8),), "textutils"),
    Snippet("caesar", "s, k",
            "Shift every letter of s by k places in the alphabet, keeping case; leave other characters.",
            "    out = []\n    for c in s:\n        if c.isalpha():\n"
            "            base = ord(\"a\") if c.islower() else ord(\"A\")\n"
            "            out.append(chr((ord(c) - base + k) % 26 + base))\n"
            "        else:\n            out.append(c)\n    return \"\".join(out)\n",
            (("% 26", "% 25"), ("ord(\"a\") if c.islower() else ord(\"A\")", "ord(\"a\")")),
            lambda r: (r.choice(["Hello, World", "abc xyz", "Zebra", "Python 3", "attack at dawn"]), r.randint(1, 25)),
            "textutils"),
    Snippet("to_snake", "name", "Convert a CamelCase name to snake_case.",
            "    out = []\n    for i, c in enumerate(name):\n        if c.isupper() and i > 0:\n"
            "            out.append(\"_\")\n        out.append(c.lower())\n    return \"\".join(out)\n",
            ((" and i > 0", ""), ("out.append(c.lower())", "out.append(c)")),
            lambda r: (r.choice(["CamelCase", "HttpServer", "myVariable", "Simple", "getResponseCode", "X"]),),
            "textutils"),
    Snippet("fizzbuzz", "n", "Return the FizzBuzz strings for the numbers 1 to n.",
            "    out = []\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n            out.append(\"FizzBuzz\")\n"
            "        elif i % 3 == 0:\n            out.append(\"Fizz\")\n        elif i % 5 == 0:\n"
            "            out.append(\"Buzz\")\n        else:\n            out.append(str(i))\n    return out\n",
            (("range(1, n + 1)", "range(1, n)"), ("i % 15 == 0", "i % 10 == 0")),
            lambda r: (r.randint(1, 31),), "listutils"),
    Snippet("running_max", "xs", "Return the list of the maxima of each prefix of xs.",
            "    out = []\n    best = None\n    for x in xs:\n        if best is None or x > best:\n"
            "            best = x\n        out.append(best)\n    return out\n",
            (("x > best", "x < best"), ("out.append(best)", "out.append(x)")),
            lambda r: ([r.randint(-9, 9) for _ in range(r.randint(0, 8))],), "listutils"),
    Snippet("dedupe", "xs", "Return xs without repeated items, keeping the first occurrence of each.",
            "    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n"
            "            seen.add(x)\n            out.append(x)\n    return out\n",
            (("            seen.add(x)\n", ""), ("out.append(x)", "out.insert(0, x)")),
            lambda r: ([r.randint(0, 5) for _ in range(r.randint(0, 9))],), "listutils"),
    Snippet("chunk", "xs, n", "Split xs into consecutive lists of length n (the last one may be shorter).",
            "    return [xs[i:i + n] for i in range(0, len(xs), n)]\n",
            (("range(0, len(xs), n)", "range(0, len(xs) - 1, n)"), ("xs[i:i + n]", "xs[i:i + n - 1]")),
            lambda r: ([r.randint(0, 9) for _ in range(r.randint(0, 10))], r.randint(1, 4)), "listutils"),
    Snippet("rotate", "xs, k", "Return xs rotated right by k places.",
            "    if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k]\n",
            (("xs[-k:] + xs[:-k]", "xs[k:] + xs[:k]"),),
            lambda r: ([r.randint(0, 9) for _ in range(r.randint(0, 7))], r.randint(0, 7)), "listutils"),
]
BY_NAME = {s.name: s for s in SNIPPETS}
MODULES = sorted({s.module for s in SNIPPETS})
