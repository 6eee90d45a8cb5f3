"""Text helpers, available to every script of the sandbox as plain functions."""

import re

_WORD = re.compile(r"[\w']+")


def word_count(text: str) -> int:
    """Returns the number of words in text."""
    return len(_WORD.findall(text))


def top_words(text: str, n: int = 3) -> list[dict]:
    """Returns the n most frequent words of text (lower-cased) with their counts."""
    counts = {}
    for word in _WORD.findall(text.lower()):
        counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [{"word": w, "count": c} for w, c in ranked[:n]]
