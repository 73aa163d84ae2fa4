"""The default model's tokenizer, built straight from its GGUF file in a fraction of a second.

Going through transformers (``AutoTokenizer.from_pretrained(gguf_file=...)``) parses every
metadata element with ``gguf.GGUFReader`` and costs ~10 s, all of it on a fresh home's first
``codekv index``. Only the header's key-value section is needed here, read with ``struct``
(format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), and the result is the
tokenizer transformers' ``GGUFLlamaConverter`` makes of a ``gpt2`` (byte-level BPE) vocabulary:
``tests/test_gguf_vocab.py`` checks that both give the same ids on a broad sample.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

BUILD = "gguf_vocab-1"  # part of the cache key of built tokenizers: bump when the build changes
MAGIC = b"GGUF"
# GGUF value types -> struct format of one scalar; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9
_CONTROL = 3  # the tokenizer.ggml.token_type of special tokens


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


# Tokenizer models whose sequences start with a BOS when the GGUF does not say (llama.cpp's
# defaults: SentencePiece and WordPiece add one, byte-level BPE does not).
ADDS_BOS_BY_DEFAULT = frozenset({"llama", "bert"})


def leading_ids(path: Path) -> list[int]:
    """The BOS every sequence starts with where the GGUF's tokenizer adds one, as llama.cpp
    reads it: ``tokenizer.ggml.add_bos_token``, else its tokenizer model's default; or []."""
    meta = read_metadata(path, "tokenizer.ggml.")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    adds = meta.get("tokenizer.ggml.add_bos_token")
    if adds is None:
        adds = meta.get("tokenizer.ggml.model") in ADDS_BOS_BY_DEFAULT
    return [int(bos)] if adds and bos is not None else []


def read_metadata(path: Path, prefix: str = "") -> dict:
    """The header's key-value pairs whose keys start with ``prefix``."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != MAGIC:
            raise GGUFError(f"{path} is not a GGUF file")
        version, _tensors, count = struct.unpack_from("<IQQ", data, 4)
        if version not in (2, 3):
            raise GGUFError(f"{path} is GGUF version {version}; codekv reads versions 2 and 3")
        reader = _Reader(data, 24)
        found = {}
        try:
            for _ in range(count):
                key = reader.string()
                value = reader.value(reader.scalar("I"))
                if key.startswith(prefix):
                    found[key] = value
        except (struct.error, UnicodeDecodeError) as error:
            raise GGUFError(f"{path} has a damaged GGUF header: {error}") from error
    return found


def tokenizer_from_gguf(path: Path):
    """A ``tokenizers.Tokenizer`` of the GGUF's byte-level BPE vocabulary (model ``gpt2``),
    as transformers converts it for counting: the same vocabulary, merges, special tokens,
    normalizer and pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    meta = read_metadata(path, "tokenizer.ggml.")
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(f"{path}: tokenizer model {model!r}; only 'gpt2' (byte-level BPE) is built")
    tokens = meta["tokenizer.ggml.tokens"]
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(
        models.BPE(
            {token: index for index, token in enumerate(tokens)},
            [tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]],
            unk_token=tokens[unknown] if unknown is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    types = meta.get("tokenizer.ggml.token_type", [])
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], normalized=False, special=True)
         for i, kind in enumerate(types) if kind == _CONTROL]
    )
    tokenizer.normalizer = normalizers.Sequence([])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=True
    )
    return tokenizer


_NORMAL, _USER_DEFINED = 1, 4  # tokenizer.ggml.token_type: a piece; "\n", runs of spaces


def gemma_tokenizer_from_gguf(path: Path):
    """Gemma's tokenizer (``GemmaTokenizer``) from a GGUF's SentencePiece vocabulary (model
    ``llama``, scores, no merges): transformers' GGUF loader builds it without merges, so every
    character became a token (3,042 tokens where llama.cpp reads 823). SentencePiece merges the
    adjacent pair whose joined piece scores highest; as BPE merges, each pair of pieces joining
    into a piece ranks by that piece's score (transformers' ``generate_merges``)."""
    from tokenizers import AddedToken
    from transformers import GemmaTokenizer
    from transformers.convert_slow_tokenizer import generate_merges

    meta = read_metadata(path, "tokenizer.ggml.")
    model = meta.get("tokenizer.ggml.model")
    if model != "llama" or "tokenizer.ggml.scores" not in meta:
        raise GGUFError(f"{path}: tokenizer model {model!r}; Gemma's is SentencePiece ('llama')")
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    vocab = {token: index for index, token in enumerate(tokens)}
    # Control tokens (<start_of_turn>) are special; user-defined ones ("\n", runs of spaces)
    # are read whole like them, but are text. Byte pieces (<0x0A>) stay in the model.
    added = {token: kind for token, kind in zip(tokens, types)
             if kind in (_CONTROL, _USER_DEFINED)}
    merges = generate_merges(vocab, dict(zip(tokens, scores)), skip_tokens=added)

    def named(key: str, default: str) -> str:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None else default

    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, unk_token=named("unknown", "<unk>"),
                               bos_token=named("bos", "<bos>"), eos_token=named("eos", "<eos>"),
                               pad_token=named("padding", "<pad>"))
    tokenizer.add_tokens([AddedToken(token, normalized=False, special=kind == _CONTROL)
                          for token, kind in added.items()])
    return tokenizer


class _Reader:
    """Reads GGUF values (little-endian) from a buffer, moving through it."""

    __slots__ = ("data", "at")

    def __init__(self, data, at: int):
        self.data = data
        self.at = at

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        (size,) = struct.unpack_from("<Q", self.data, self.at)
        start = self.at + 8
        self.at = start + size
        if self.at > len(self.data):
            raise struct.error("string runs past the end of the file")
        return self.data[start:self.at].decode("utf-8")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, size = self.scalar("I"), self.scalar("Q")
            if item in _SCALARS:
                fmt = f"<{size}{_SCALARS[item]}"
                values = list(struct.unpack_from(fmt, self.data, self.at))
                self.at += struct.calcsize(fmt)
                return values
            return [self.value(item) for _ in range(size)]
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        raise GGUFError(f"unknown GGUF value type {kind}")
