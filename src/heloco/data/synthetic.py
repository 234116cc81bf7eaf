"""A built-in multilingual corpus generated in code, so the default run needs no files.

Five pseudo-languages with distinct alphabets, syllable shapes, word lengths, Zipfian word
frequencies and word-bigram habits. Each is a small generative grammar: a lexicon built from
the language's syllables, words drawn from a Zipf law (Zipf 1935) mixed with a per-word set of
preferred successors (so there is structure for a model to learn beyond unigram statistics),
grouped into capitalised sentences and paragraphs. The text is a pure function of the language
table and ``chars_per_language``: no randomness leaks from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from heloco.data.corpus import Corpus
from heloco.data.seeding import derive_seed

CORPUS_SEED = 20260529
SUCCESSORS_PER_WORD = 3


@dataclass(frozen=True)
class PseudoLanguage:
    """The generative statistics of one pseudo-language."""

    name: str
    consonants: str
    vowels: str
    syllable_shapes: tuple[str, ...]  # "C"/"V" patterns, e.g. "CVC"
    syllables_per_word: tuple[int, int]  # inclusive range
    lexicon_size: int
    zipf_exponent: float
    follow_prob: float  # probability that the next word is one of the previous word's successors
    words_per_sentence: tuple[int, int]  # inclusive range
    sentences_per_paragraph: tuple[int, int]  # inclusive range
    end_marks: str


# fmt: off
LANGUAGES: tuple[PseudoLanguage, ...] = (
    # name       consonants    vowels      syllable shapes         syll/word lexicon zipf  follow words/sent sent/para end
    PseudoLanguage("synth_a", "ptkmnsh",    "aiueo",    ("CV",),                (1, 4), 1200, 1.05, 0.5, (4, 10), (2, 5), "."),
    PseudoLanguage("synth_b", "bdgkrstvwz", "aeiou",    ("CVC", "CCVC", "VC"),  (1, 3), 1600, 1.0,  0.4, (6, 14), (3, 6), ".!"),
    PseudoLanguage("synth_c", "lmnrstcdv",  "aeioàéèó", ("CV", "CVV", "V"),     (2, 4), 1400, 1.1,  0.6, (5, 12), (2, 4), ".?"),
    PseudoLanguage("synth_d", "kqxjzhrf",   "äöüeiy",   ("CVC", "CV", "CCV"),   (1, 3), 1000, 1.2,  0.3, (3, 8),  (3, 7), ".;"),
    PseudoLanguage("synth_e", "ptfswylgn",  "aoåøu",    ("VCV", "CVC", "CV"),   (1, 3), 1800, 0.95, 0.5, (7, 16), (1, 3), "!."),
)
# fmt: on


def make_word(lang: PseudoLanguage, rng: np.random.Generator) -> str:
    """One lexicon entry: a few syllables of the language's shapes and letters."""
    n_syll = int(rng.integers(lang.syllables_per_word[0], lang.syllables_per_word[1] + 1))
    letters = []
    for _ in range(n_syll):
        shape = lang.syllable_shapes[int(rng.integers(len(lang.syllable_shapes)))]
        for slot in shape:
            pool = lang.consonants if slot == "C" else lang.vowels
            letters.append(pool[int(rng.integers(len(pool)))])
    return "".join(letters)


def word_sequence(lang: PseudoLanguage, n_words: int, rng: np.random.Generator) -> list[int]:
    """Lexicon indices: each word follows its predecessor's successor list with probability
    ``follow_prob``, otherwise it is a fresh Zipf draw."""
    ranks = np.arange(1, lang.lexicon_size + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-lang.zipf_exponent)
    cdf /= cdf[-1]
    flat_cdf = np.cumsum(ranks**-0.5)  # successors favour frequent words less than Zipf does
    flat_cdf /= flat_cdf[-1]
    successors = np.searchsorted(
        flat_cdf, rng.random((lang.lexicon_size, SUCCESSORS_PER_WORD)), side="right"
    ).tolist()
    fresh = np.searchsorted(cdf, rng.random(n_words), side="right").tolist()
    follow = (rng.random(n_words) < lang.follow_prob).tolist()
    pick = rng.integers(SUCCESSORS_PER_WORD, size=n_words).tolist()
    words = []
    prev = fresh[0]
    for i in range(n_words):
        prev = successors[prev][pick[i]] if follow[i] else fresh[i]
        words.append(prev)
    return words


def generate_language(lang: PseudoLanguage, n_chars: int, seed: int) -> str:
    """At least ``n_chars`` characters of text in ``lang`` (whole paragraphs, newline-ended)."""
    rng = np.random.default_rng(seed)
    lexicon = [make_word(lang, rng) for _ in range(lang.lexicon_size)]
    mean_len = sum(map(len, lexicon)) / len(lexicon) + 1
    paragraphs: list[str] = []
    total = 0
    while total < n_chars:
        words = [lexicon[i] for i in word_sequence(lang, int(n_chars / mean_len) + 64, rng)]
        lo, hi = lang.words_per_sentence
        cuts = np.cumsum(rng.integers(lo, hi + 1, size=len(words) // lo + 1)).tolist()
        marks = rng.integers(len(lang.end_marks), size=len(cuts)).tolist()
        sentences = []
        for start, stop, mark in zip([0, *cuts], cuts, marks, strict=False):
            if stop > len(words):
                break
            sentence = " ".join(words[start:stop])
            sentences.append(sentence[0].upper() + sentence[1:] + lang.end_marks[mark])
        lo, hi = lang.sentences_per_paragraph
        i = 0
        for size in rng.integers(lo, hi + 1, size=len(sentences)).tolist():
            if i + size > len(sentences) or total >= n_chars:
                break
            paragraphs.append(" ".join(sentences[i : i + size]))
            total += len(paragraphs[-1]) + 1
            i += size
    return "\n".join(paragraphs) + "\n"


@lru_cache(maxsize=4)
def synthetic_corpus(chars_per_language: int) -> Corpus:
    """The five pseudo-languages, each with at least ``chars_per_language`` characters."""
    texts = tuple(
        generate_language(lang, chars_per_language, derive_seed(CORPUS_SEED, i))
        for i, lang in enumerate(LANGUAGES)
    )
    return Corpus(tuple(lang.name for lang in LANGUAGES), texts)
