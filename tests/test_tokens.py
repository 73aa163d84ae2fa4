"""Token counts from cached word splits equal counts from one encode of the whole file."""

from __future__ import annotations

import bisect
import json

import pytest
from fixtures.needs import missing

from codekv.tokens import CounterSpec, TokenCounter, default_gguf_path, reference_starts

# Each is tokenized alone; together they hit every branch of the word splitter: indentation,
# tabs and other ASCII whitespace, blank lines, trailing spaces, contractions, digits,
# punctuation runs, non-ASCII letters and whitespace (next to newlines, too), an added
# token's text, and a file that is not UTF-8 (encoded whole, as before).
SOURCES = [
    b"def area(width, height):\n    return width * height\n",
    b"class Stack:\n\tdef push(self, item):  \n\t\tself.items.append(item)\n\n\n  x = 1\n",
    b"it's they're we've I'm you'll he'd 'S 12345 3.14e-10 a1b2 ___init__ ->= !== \x0b\x0c\r\n",
    b"    \n  \n\n    pass",
    "caf\u00e9 = '\u00fcber'  # na\u00efve\n    r\u00e9sum\u00e9()\n\u3000x\n".encode(),
    "a\u00a0\nb \u00a0\n  c\u2028d\n\u00e9\n\n\u00e9".encode(),
    b"x = '<|endoftext|>'\n    y = <|endoftext|>z\n<|endoftext|>\n",
    b"print(1)\n\xff\xfe broken = '\xc3'\n    ok()\n",
    b"",
    b"a",
]
# Not trained on U+FFFD: a byte that is not UTF-8 stays three tokens, more than its one byte.
TRAINING = [s.decode("utf-8", "ignore") for s in SOURCES] * 3 + [
    "def push(self, item):\n        self.items.append(item)\n    return width * height\n"
]


@pytest.fixture(scope="module")
def byte_level_bpe(tmp_path_factory):
    """A small byte-level BPE like the default model's, trained in milliseconds."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return CounterSpec("tokenizer", str(path))


def _check_all_ranges(counter: TokenCounter, source: bytes) -> None:
    starts = reference_starts(counter._tokenizer, source)
    counter.reset(source)
    offsets = sorted({0, len(source), *starts, *(s + 1 for s in starts if s < len(source))})
    for i, start in enumerate(offsets):
        for end in offsets[i:]:
            expected = bisect.bisect_left(starts, end) - bisect.bisect_left(starts, start)
            if end - start <= 1:
                expected = end - start  # as before: a range of 0 or 1 bytes is not tokenized
            assert counter.count(start, end) == expected, (source, start, end)


def test_word_counts_equal_whole_file_counts(byte_level_bpe):
    counter = TokenCounter(byte_level_bpe)
    assert counter._words is not None  # the fast path is the one under test
    for source in SOURCES:
        _check_all_ranges(counter, source)
    # Again with every word cached: the second pass must not depend on the first's misses.
    for source in reversed(SOURCES):
        _check_all_ranges(counter, source)


def _char_starts(source: bytes) -> list[int]:
    """Offsets the chunker can cut at: character boundaries (every byte if not UTF-8)."""
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError:
        return list(range(len(source) + 1))
    return sorted({len(text[:i].encode()) for i in range(len(text) + 1)})


def test_fits_answers_like_counting(byte_level_bpe):
    """``fits`` skips counting ranges of at most ``budget`` bytes: the same answers, the
    file that is not UTF-8 (more tokens than bytes there) included."""
    for counter in (TokenCounter(byte_level_bpe), TokenCounter(CounterSpec("bytes"))):
        for source in SOURCES:
            counter.reset(source)
            offsets = _char_starts(source)
            for budget in (1, 2, 3, 5, 8, 13):
                for i, start in enumerate(offsets):
                    for end in offsets[i:]:
                        expected = counter.count(start, end) <= budget
                        assert counter.fits(start, end, budget) == expected, (source, start, end)


def test_hard_stretches_are_cut_where_words_always_end(byte_level_bpe):
    words = TokenCounter(byte_level_bpe)._words
    source = "x = 1\n    y = '\u00e9'\n  z = 2\n".encode()
    # The run "\n    " before y starts a word in any context; so does the "\n  " after it.
    assert list(words._hard_stretches(source)) == [(5, 18)]
    assert list(words._hard_stretches(b"plain ascii\n")) == []
    assert list(words._hard_stretches(b"a\n<|endoftext|>\nb")) == [(1, 15)]


def test_other_tokenizers_are_encoded_whole(byte_level_bpe, tmp_path):
    """A tokenizer the word splitter does not model (here: a prefix space) keeps the old path."""
    config = json.loads(open(byte_level_bpe.tokenizer_json).read())
    config["pre_tokenizer"]["add_prefix_space"] = True
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(config))
    counter = TokenCounter(CounterSpec("tokenizer", str(path)))
    assert counter._words is None
    _check_all_ranges(counter, SOURCES[1])


def test_bytes_counter_counts_bytes():
    counter = TokenCounter(CounterSpec("bytes"))
    counter.reset(b"hello world")
    assert counter.count(0, 11) == 11
    assert counter.count(3, 3) == 0


@pytest.mark.model
def test_default_tokenizer_word_counts_equal_whole_file_counts():
    if default_gguf_path() is None:
        missing("the default model is not installed")
    from codekv.tokens import default_counter_spec

    counter = TokenCounter(default_counter_spec())
    assert counter._words is not None
    for source in SOURCES:
        _check_all_ranges(counter, source)
