"""The llama.cpp backend (llama-cpp-python's low-level ctypes bindings): composition inside the
engine, on a GGUF as it is.

llama.cpp keeps a sequence's KV as an opaque state, so the chunk store holds each chunk's
sequence state (``llama_state_seq_get_data``), tied to the llama.cpp build, the GGUF and the
KV cache type by the model fingerprint. A request is built in sequence 0 of one context:

- each chunk's state is restored into scratch sequence 1 (at the positions it was saved at),
  shifted to its offset (``llama_memory_seq_add``; the RoPE K-shift runs at the next decode),
  shared into sequence 0 (``seq_cp``) and dropped from 1;
- selected tokens are recomputed in place: their old cells are removed from sequence 0 and
  they are decoded there at their own positions, in a few batches whatever their spread,
  each attending to the cells at positions up to its own, fresh ones included. Stock
  llama.cpp requires a batch to continue its sequence; the setup's build carries a patch
  (``patches/llama.cpp-scattered-positions.patch``) that lifts that check while a request is
  recomputed (``scattered_batches``). Without it a contiguous run of selected tokens at
  p..p+k-1 is recomputed in scratch sequence 2 holding sequence 0's cells [0, p) and its fresh
  cells are shared back into 0, one decode per run, in request order: the same KV, from
  many small decodes;
- the query is decoded at the end of sequence 0.

A server keeps recent prompts as sequence states in host memory (``state_kv``), as
llama-server's prompt cache does: a later request starting with the same tokens places a
``KeptPrefix`` of one, restored into sequence 0 and cut after its first tokens. Kept prompts
never hold cells of the context: without flash attention llama.cpp scores each batch against
every used cell, other sequences' included, so prompts kept there would slow every request.

A sliding-window model (Gemma 3) runs with ``swa_full``: its window layers' cache keeps every
cell, so llama.cpp can shift them (the K-shift rotates each layer with its own RoPE base) and the
mask applies the window. A chunk's state is saved whole: a sequence's own state leaves out the
cells its window has passed, which a run recomputed inside the chunk needs. llama.cpp may hand a
cell the window has passed to new tokens when it is held by one sequence only; while a run is
decoded, the cells before it are also held by sequence 2, the cells placed in position order
put its own freed cells first in the search, and what the query's tokens may take is behind
every window after them.

Query-aware rules read the query's attention over the re-positioned chunks from a second
context (the probe), whose eval callback reads the probe layers' softmax
(``llamacpp_attention``): the chunk states are placed there in request order from an empty
cache, so cell i holds position i, and the query is decoded after them.

One context serves one request at a time: a request state stays usable until the backend
starts the next request (or prefills a chunk); using it later is an error, never a silent
answer from another request's KV. llama.cpp is exact for one batch shape only: with flash
attention the same tokens decoded in other batches differ (KL ~0.014 on the default GGUF);
``batch_reference`` measures that floor for a composed request.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from codekv.backends import (
    ModelInfo,
    UnsupportedModel,
    chat_template_of,
    mean_nll,
    prompt_tokens,
)
from codekv.backends.engines import LLAMA_CPP
from codekv.backends.llamacpp_attention import AttentionReader
from codekv.stores.entry import BadEntry, KVEntry
from codekv.tokens import file_digest

KV_TYPES = {"f16": 1, "f32": 0, "q8_0": 8}  # name -> ggml type id (llama.h / ggml.h)
# Selected positions decoded per scattered batch (at most ``n_batch``): few enough that early
# batches see few cells (parts are placed as batches reach them), enough to read the weights
# seldom.
RECOMPUTE_BATCH = 128
REQUEST, CHUNK, RUN = 0, 1, 2  # sequence ids: the request, a restored chunk, a recomputed run
# A sliding-window model's cache takes a cell held by one sequence alone as free once it is a
# window behind that sequence's last position (even with swa_full): placing later parts or
# decoding would then overwrite request cells that a run recomputed in the middle, or a token
# after a rewind, still attends to. Every request cell is also held by PIN, so none is.
PIN = 3
DEVIATION_REFUSAL = (
    "llama.cpp keeps KV as an opaque per-sequence state: per-token KV deviation cannot be "
    "scored without reading K/V tensors"
)
UNSHIFTED_REFUSAL = (
    "llama.cpp needs consecutive positions: chunk KV that is not re-positioned cannot be "
    "composed"
)


def _bindings():
    """``llama_cpp`` (low-level bindings), with ggml's log silenced once per process."""
    try:
        import llama_cpp as L
    except ImportError as error:  # the optional extra is missing
        raise ImportError(
            "the llama.cpp backend needs llama-cpp-python: pip install 'codekv[llamacpp]'"
        ) from error
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        # Held at module level: a collected ctypes callback crashes the next log line.
        _LOG_CALLBACK = L.llama_log_callback(lambda level, text, user_data: None)
        L.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())
        L.llama_backend_init()
    return L


_LOG_CALLBACK = None


@dataclass(frozen=True)
class SequenceState:
    """A token span's KV as llama.cpp sequence state: cells saved at positions ``saved_at``..,
    to be placed at ``start``.. (re-positioning only records the shift)."""

    data: np.ndarray  # uint8, as llama_state_seq_get_data wrote it (may be a store mmap)
    n_tokens: int
    saved_at: int
    start: int

    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True, eq=False)
class KeptPrefix:
    """The first ``n_tokens`` cells (positions 0..) of a kept prompt's state: placed by
    restoring the state and dropping the cells after them, never cut and saved again."""

    state: SequenceState
    n_tokens: int
    start: int = 0

    def nbytes(self) -> int:
        return 0  # the state belongs to the prompt cache that keeps it


@dataclass(frozen=True)
class Gap:
    """Positions ``start``.. that hold no cells until the request recomputes them in place
    (the patched build's placeholder: nothing is computed for it first)."""

    n_tokens: int
    start: int

    def nbytes(self) -> int:
        return 0


@dataclass
class LlamaRequest:
    """A request in sequence 0 of the backend's context; ``logits`` predict the next token."""

    token_ids: list[int]
    logits: torch.Tensor
    ticket: int = field(default=0, repr=False)
    # Where the decode calls that built it started (besides 0): ``batch_reference`` decodes
    # the same tokens in the same batches without composition, llama.cpp's noise floor.
    cuts: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.token_ids)


class LlamaCppBackend:
    """Composition on one llama.cpp context over a GGUF model."""

    deviation_refusal = DEVIATION_REFUSAL
    relevance_refusal = None  # read through the eval callback of a probe context
    unshifted_refusal = UNSHIFTED_REFUSAL

    def __init__(self, gguf: str | Path, n_ctx: int | None = None, kv_type: str = "f16",
                 n_threads: int | None = None, n_batch: int = 512, gguf_digest: str | None = None,
                 scattered_batches: bool = True):
        if kv_type not in KV_TYPES:
            raise ValueError(f"unknown KV cache type {kv_type!r}; choose from "
                             + ", ".join(KV_TYPES))
        threads = n_threads or threads_from_env() or len(os.sched_getaffinity(0))
        L = self._L = _bindings()
        self.path = Path(gguf)
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        self._model = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp cannot load {self.path}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self._windowed = L.llama_model_n_swa(self._model) > 0
        self.leading_ids = ([L.llama_vocab_bos(self._vocab)]
                            if L.llama_vocab_get_add_bos(self._vocab) else [])
        trained = L.llama_model_n_ctx_train(self._model)
        self.n_ctx = min(n_ctx or trained, trained)
        self.n_batch = n_batch
        self.kv_type = kv_type
        self._threads = threads
        self._ctx = L.llama_init_from_model(self._model, self._context_params())
        if not self._ctx:
            L.llama_model_free(self._model)
            raise ValueError(f"llama.cpp cannot make a {self.n_ctx}-token context for {self.path}")
        self._mem = L.llama_get_memory(self._ctx)
        self._probe_ctx = self._reader = None  # made by the first query_relevance
        self._batch = L.llama_batch_init(n_batch, 0, 1)
        self._ticket = 0  # bumped whenever sequence 0 is given to another request
        # The patched build's switch for batches at scattered positions (None: a stock build,
        # or ``scattered_batches`` off: one decode per run, as a benchmark compares).
        self._scatter = _scatter_switch(L) if scattered_batches else None
        self._ends: frozenset[int] | None = None  # end-of-generation tokens, found on first use
        digest = gguf_digest or file_digest(self.path)
        self.engine_version = (f"llama-cpp-python {L.__version__}, "
                               f"llama.cpp {L.llama_version().decode()}")
        family = self._meta("general.architecture") or "?"
        identity = {"engine": LLAMA_CPP, "version": self.engine_version, "gguf": digest,
                    "kv_type": kv_type, "flash_attn": False}
        if self._windowed:  # states saved whole (every window's cells); other models' stay
            identity["swa"] = "full"
        self.info = ModelInfo(
            family=family,
            fingerprint=hashlib.sha256(json.dumps(identity, sort_keys=True).encode()
                                       ).hexdigest()[:32],
            tokenizer_fingerprint="gguf:" + digest[:32],  # the GGUF holds the tokenizer
            dtype=_model_desc(L, self._model),
            n_layers=L.llama_model_n_layer(self._model),
            max_positions=self.n_ctx,
            unsupported=self._unsupported(family),
            engine=LLAMA_CPP,
        )
        self._identity = identity

    def _context_params(self, reader: AttentionReader | None = None):
        """The request context's parameters, or the probe's (``reader``)."""
        L = self._L
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = PIN + 1
        cparams.kv_unified = True  # sequences share cells (seq_cp shares, never copies)
        cparams.n_threads = cparams.n_threads_batch = self._threads
        cparams.type_k = cparams.type_v = KV_TYPES[self.kv_type]
        # A sliding-window model's SWA layers get a cache as large as the others' (else it holds
        # only the window's cells, and llama.cpp cannot shift them): every cell stays, composed
        # parts are shifted, and the mask applies the window.
        cparams.swa_full = self._windowed
        # Fixed, not "auto": the state layout (V transposed or not) depends on it, and with
        # flash attention the probabilities are never materialised for the probe to read.
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if reader is not None:
            cparams.cb_eval = reader.callback
        return cparams

    def close(self) -> None:
        L = self._L
        if getattr(self, "_ctx", None):
            if self._probe_ctx:
                L.llama_free(self._probe_ctx)
            L.llama_batch_free(self._batch)
            L.llama_free(self._ctx)
            L.llama_model_free(self._model)
            self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the bindings may be gone already
            pass

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = self._L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n >= len(buf):  # a longer value (a chat template): its length is known now
            buf = ctypes.create_string_buffer(n + 1)
            n = self._L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    def _unsupported(self, family: str) -> str | None:
        L = self._L
        if L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model):
            return f"{family} keeps recurrent state: cached chunk state cannot be re-positioned"
        if not L.llama_memory_can_shift(self._mem):
            return f"llama.cpp cannot shift positions of {family} KV (no RoPE K-shift)"
        return None

    @property
    def scattered_batches(self) -> bool:
        """Whether selected positions are recomputed in scattered batches (the patched
        build), not one decode per run of them."""
        return self._scatter is not None

    @property
    def free_placeholders(self) -> bool:
        """Whether text recomputed in place needs no cells first (a ``Gap``): with scattered
        batches, on a model without a sliding window (whose probe maps cells to positions by
        the window). Else a placeholder is the text computed alone: a prefill each."""
        return self._scatter is not None and not self._windowed

    # -- tokens --------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """``text`` as text: a control token's spelling in it is read as characters."""
        data = text.encode()
        room = len(data) + 8
        buf = (self._L.llama_token * room)()
        n = self._L.llama_tokenize(self._vocab, data, len(data), buf, room, False, False)
        if n < 0:  # never more tokens than bytes + 8, but the API reports it this way
            raise ValueError(f"llama.cpp tokenization needs {-n} tokens")
        return list(buf[:n])

    def _piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    @property
    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``."""
        return self._meta("tokenizer.chat_template")

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat as the GGUF's template (else ``CHATML``) renders it (with transformers'
        Jinja renderer, as the transformers engine does), ending with the assistant's turn."""
        from transformers.utils.chat_template_utils import render_jinja_template

        names = {}
        for name, token in (("bos_token", self._L.llama_vocab_bos(self._vocab)),
                            ("eos_token", self._L.llama_vocab_eos(self._vocab))):
            names[name] = self._piece(token, True).decode("utf-8", "replace") if token >= 0 else ""
        try:
            rendered, _ = render_jinja_template([messages], tools=tools or None,
                                                chat_template=chat_template_of(self),
                                                add_generation_prompt=True, **names)
        except Exception as error:  # the template's own raise_exception, a Jinja error
            raise ValueError(str(error)) from None
        return rendered[0]

    def tokenize_prompt(self, text: str, markers: Sequence[tuple[int, int]] = ()
                        ) -> tuple[list[int], list[tuple[int, int]]]:
        return prompt_tokens(self, text, markers)

    @functools.cached_property
    def markers(self) -> dict[str, int]:
        """The tokens llama.cpp reads out of text only when parsing special tokens: control
        and unknown ones (user-defined ones, Gemma's runs of newlines, it reads whole in any
        text)."""
        L = self._L
        kinds = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_UNKNOWN
        found = {}
        for token in range(L.llama_vocab_n_tokens(self._vocab)):
            if L.llama_vocab_get_attr(self._vocab, token) & kinds:
                text = self._piece(token, True).decode("utf-8", "replace")
                if text:
                    found.setdefault(text, token)
        return found

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids (as ``tokenize``) and each token's character span in ``text``."""
        ids = self.tokenize(text)
        data = text.encode()
        char_at = np.zeros(len(data) + 1, dtype=np.int64)  # byte offset -> character offset
        position = 0
        for index, char in enumerate(text):
            width = len(char.encode())
            char_at[position : position + width] = index
            position += width
        char_at[len(data)] = len(text)
        pieces = [self._piece(token) for token in ids]
        spelled = b"".join(pieces)
        # A SentencePiece vocabulary spells a leading space the text does not have.
        byte = -1 if spelled == b" " + data else 0
        if spelled[-byte:] != data:
            raise UnsupportedModel("llama.cpp tokens do not spell the text back byte for byte: "
                                   "anchors cannot be placed")
        offsets = []
        for piece in pieces:
            first, end = max(byte, 0), max(byte + len(piece), 0)
            offsets.append((int(char_at[first]), int(char_at[end - 1]) + 1 if end > first
                            else int(char_at[first])))
            byte += len(piece)
        return ids, offsets

    def detokenize(self, token_ids: list[int]) -> str:
        return b"".join(self._piece(t) for t in token_ids).decode("utf-8", "replace")

    @property
    def eos_token_id(self) -> int | None:
        token = self._L.llama_vocab_eos(self._vocab)
        return token if token >= 0 else None

    def _is_end(self, token: int) -> bool:
        return bool(self._L.llama_vocab_is_eog(self._vocab, token))

    # -- the context ---------------------------------------------------------------------
    def _take_context(self) -> int:
        """Start over: every sequence empty; the previous request state is no longer usable."""
        self._L.llama_memory_clear(self._mem, False)
        self._ticket += 1
        return self._ticket

    def _pin(self, source: int, p0: int, p1: int, mem=None) -> None:
        """Hold ``source``'s cells at positions [p0, p1) of the request in PIN too (a
        sliding-window model's only: no other cache frees cells behind a window)."""
        if self._windowed:
            self._L.llama_memory_seq_cp(mem or self._mem, source, PIN, p0, p1)

    def _unpin(self, p0: int, p1: int) -> None:
        if self._windowed:
            self._L.llama_memory_seq_rm(self._mem, PIN, p0, p1)

    def _check(self, state: LlamaRequest) -> None:
        if state.ticket != self._ticket:
            raise RuntimeError("this llama.cpp request state was replaced by a later request "
                               "on the same backend (one context holds one request)")

    def _decode(self, token_ids: list[int], start: int, seq: int, logits: str = "last",
                ctx=None, positions: Sequence[int] | None = None) -> torch.Tensor | None:
        """Decode tokens at positions ``start``.. (or at ``positions``) of ``seq`` in batches
        of ``n_batch``; logits of the last token (``"last"``), of every token (``"all"``) or
        none. In the request context unless ``ctx`` (the probe's) is given."""
        L, batch, ctx = self._L, self._batch, ctx or self._ctx
        if positions is None:
            positions = range(start, start + len(token_ids))
        if positions and positions[-1] >= self.n_ctx:
            raise ValueError(f"positions up to {positions[-1] + 1} exceed the llama.cpp "
                             f"context of {self.n_ctx}")
        rows = []
        for first in range(0, len(token_ids), self.n_batch):
            part = token_ids[first : first + self.n_batch]
            last_part = first + len(part) == len(token_ids)
            batch.n_tokens = len(part)
            for i, token in enumerate(part):
                batch.token[i] = token
                batch.pos[i] = positions[first + i]
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = logits == "all" or (logits == "last" and last_part
                                                      and i == len(part) - 1)
            code = L.llama_decode(ctx, batch)
            if code != 0:
                raise RuntimeError(f"llama_decode failed ({code}) at positions "
                                   f"{positions[first]}..{positions[first + len(part) - 1]}")
            if logits == "all":
                rows.append(self._logits(len(part)))
        if logits == "all":
            return torch.cat(rows)
        if logits == "last":
            return self._logits(1)[0]
        return None

    def _logits(self, n: int) -> torch.Tensor:
        """The last ``n`` output rows of the latest decode, copied out of llama.cpp."""
        pointer = self._L.llama_get_logits(self._ctx)
        rows = np.ctypeslib.as_array(pointer, shape=(n * self.n_vocab,))
        return torch.from_numpy(rows.reshape(n, self.n_vocab).copy())

    def _save(self, seq: int, n_tokens: int, saved_at: int, alone: bool = False) -> SequenceState:
        """Sequence ``seq``'s cells as a state. ``alone``: no other sequence holds cells, so
        every cell is saved as the whole cache's (sequence -1): a sequence's own state leaves
        out the cells its sliding-window layers no longer attend to (all but the last
        window's), which a recompute inside the span needs."""
        L = self._L
        which = -1 if alone and self._windowed else seq
        size = L.llama_state_seq_get_size(self._ctx, which)
        data = np.empty(size, dtype=np.uint8)
        written = L.llama_state_seq_get_data(
            self._ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, which)
        if written != size:
            raise RuntimeError(f"llama.cpp saved {written} of {size} bytes of sequence state")
        return SequenceState(data, n_tokens, saved_at, saved_at)

    def _restore(self, kv: SequenceState, seq: int, ctx=None) -> None:
        data = np.ascontiguousarray(kv.data)
        read = self._L.llama_state_seq_set_data(
            ctx or self._ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), data.nbytes, seq)
        if read != data.nbytes:
            raise RuntimeError("llama.cpp refused a chunk's sequence state (another build, "
                               "model or KV type?)")

    # -- chunk KV ------------------------------------------------------------------------
    def prefill_chunk(self, token_ids: list[int], prefix_ids: list[int] = (),
                      prefix_kv: SequenceState | KeptPrefix | None = None) -> SequenceState:
        """A chunk's sequence state computed alone from position 0, or right after
        ``prefix_ids`` (whose cells are dropped: the chunk's then start at ``len(prefix_ids)``).
        With ``prefix_kv`` (their cells, exact, at 0..) those are placed, not computed, and the
        chunk is decoded after them in the batches a whole prefill would use (every
        ``n_batch`` from 0), so the batch-split floor reads it as any chunk state."""
        if not token_ids:
            raise ValueError("an empty chunk has no KV")
        n = len(prefix_ids)
        if prefix_kv is not None and n:
            return self._chunk_after(list(token_ids), list(prefix_ids), prefix_kv)
        self._take_context()
        self._decode(list(prefix_ids) + list(token_ids), 0, CHUNK, logits="none")
        if n:
            self._L.llama_memory_seq_rm(self._mem, CHUNK, 0, n)
        state = self._save(CHUNK, len(token_ids), n, alone=True)
        self._L.llama_memory_seq_rm(self._mem, CHUNK, -1, -1)
        return state

    def _chunk_after(self, token_ids: list[int], prefix_ids: list[int],
                     prefix_kv: SequenceState | KeptPrefix) -> SequenceState:
        n = len(prefix_ids)
        if prefix_kv.n_tokens != n or prefix_kv.start != 0:
            raise ValueError(f"prefix KV of {prefix_kv.n_tokens} tokens at {prefix_kv.start}, "
                             f"for {n} prefix ids at 0")
        if n + len(token_ids) > self.n_ctx:
            raise ValueError(f"positions up to {n + len(token_ids)} exceed the llama.cpp "
                             f"context of {self.n_ctx}")
        L, mem = self._L, self._mem
        self._take_context()
        self._place([prefix_kv], self._ctx, mem)
        aligned = min(-(-n // self.n_batch) * self.n_batch - n, len(token_ids))
        for first, end in ((0, aligned), (aligned, len(token_ids))):
            if end > first:
                self._decode(token_ids[first:end], n + first, REQUEST, logits="none")
        L.llama_memory_seq_rm(mem, REQUEST, 0, n)
        self._unpin(-1, -1)  # the state holds the chunk's cells alone
        try:
            return self._save(REQUEST, len(token_ids), n, alone=True)
        finally:
            L.llama_memory_seq_rm(mem, REQUEST, -1, -1)

    def placeholder(self, token_ids: list[int], start: int) -> SequenceState | Gap:
        """What stands at ``start``.. for context tokens the request recomputes in place: no
        cells (``Gap``) where placeholders are free, else the tokens computed alone (a
        request decoded one run at a time continues from cells there)."""
        if self.free_placeholders:
            return Gap(len(token_ids), start)
        return self.reposition(self.prefill_chunk(token_ids), start)

    def reposition(self, kv: SequenceState | Gap, start: int) -> SequenceState | Gap:
        """Record the move; the engine shifts the cells (RoPE K-shift) when they are placed."""
        return replace(kv, start=start)

    def concat(self, parts: list[SequenceState]) -> list[SequenceState]:
        """Consecutive spans, placed one after another when the request is built; a kept
        prefix only first."""
        if any(isinstance(part, KeptPrefix) for part in parts[1:]):
            raise ValueError("a kept prefix starts a request: it cannot follow other parts")
        offset = parts[0].start
        for part in parts:
            if part.start != offset:
                raise UnsupportedModel(UNSHIFTED_REFUSAL)
            offset += part.n_tokens
        return list(parts)

    def to_entry(self, kv: SequenceState, provenance: dict) -> KVEntry:
        """The state as one uint8 "layer" ``[1, 1, bytes]`` (no values): the store checksums
        and writes it like any entry; the engine identity rides in the provenance too."""
        blob = torch.from_numpy(kv.data).view(1, 1, -1)
        provenance = dict(provenance, llama_cpp=self._identity, saved_at=kv.saved_at)
        return KVEntry([blob], [torch.empty((1, 1, 0), dtype=torch.uint8)], provenance)

    def from_entry(self, entry: KVEntry, start: int) -> SequenceState:
        """The stored state; raises ``BadEntry`` for one this context must not restore (another
        build, model or KV type, not a state, or without its token count and position)."""
        if entry.provenance.get("llama_cpp") != self._identity:
            raise BadEntry("a chunk state from another llama.cpp build, model or KV type is "
                           "never restored")
        if len(entry.keys) != 1:
            raise BadEntry("not a llama.cpp sequence state")
        (blob,) = entry.keys
        if blob.dtype != torch.uint8 or blob.shape[:2] != (1, 1) or not blob.shape[2]:
            raise BadEntry("not a llama.cpp sequence state")
        n_tokens, saved_at = (entry.provenance.get(k) for k in ("n_tokens", "saved_at"))
        if not (_count(n_tokens) and n_tokens > 0 and _count(saved_at)):
            raise BadEntry(f"a llama.cpp state needs n_tokens >= 1 and saved_at >= 0, not "
                           f"{n_tokens!r} and {saved_at!r}")
        return SequenceState(blob.reshape(-1).numpy(), n_tokens, saved_at, start)

    def kv_deviation(self, token_ids: list[int], context) -> torch.Tensor:
        raise UnsupportedModel(DEVIATION_REFUSAL)

    def query_relevance(self, context: list[SequenceState], query_ids: list[int],
                        layers: tuple[int, ...], hidden: list[int] = ()) -> torch.Tensor:
        """Per context position, the attention the query pays it over the reused,
        re-positioned context (what ``none`` would see): mean over query rows, heads and
        ``layers``, as the transformers backend computes it. The query is decoded in the probe
        context (a second KV cache the size of the request context, made on first use) with
        its eval callback reading ``layers``' softmax; the request context is not touched.
        ``hidden`` is for placeholders that are not KV; this engine's are (``placeholder``),
        so the query sees every position."""
        n, q = sum(part.n_tokens for part in context), len(query_ids)
        if not q:
            raise ValueError("query relevance needs query tokens")
        if not 0 <= min(layers) <= max(layers) < self.info.n_layers:
            raise ValueError(f"probe layers {layers} outside 0..{self.info.n_layers - 1}")
        if n + q > self.n_ctx:
            raise ValueError(f"request of {n + q} tokens exceeds the llama.cpp context of "
                             f"{self.n_ctx}")
        ctx, reader = self._probe()
        mem = self._L.llama_get_memory(ctx)
        # From an empty cache each restored state takes the next free cells in order, so the
        # cells hold the positions parts cover, in order (gaps have none: the query sees no
        # text there, as transformers hides placeholders); the reader checks that layout in
        # the mask before trusting it.
        self._L.llama_memory_clear(mem, False)
        self._place(context, ctx, mem)
        covered = [p for part in context if not isinstance(part, Gap)
                   for p in range(part.start, part.start + part.n_tokens)]
        reader.arm(layers, len(covered))
        try:
            self._decode(list(query_ids), n, REQUEST, logits="none", ctx=ctx)
        finally:
            reader.disarm()
        relevance = reader.relevance(q)
        if len(covered) == n:
            return relevance
        out = torch.zeros(n, dtype=relevance.dtype)
        out[torch.as_tensor(covered, dtype=torch.long)] = relevance
        return out

    def _probe(self):
        """The probe context and its attention reader (the reader holds the callback)."""
        if self._probe_ctx is None:
            reader = AttentionReader(self._L, self._L.llama_model_n_swa(self._model))
            ctx = self._L.llama_init_from_model(self._model, self._context_params(reader))
            if not ctx:
                raise RuntimeError(f"llama.cpp cannot make a {self.n_ctx}-token probe context")
            self._probe_ctx, self._reader = ctx, reader
        return self._probe_ctx, self._reader

    def _place(self, context: list[SequenceState], ctx, mem) -> None:
        """Each part's state restored in scratch sequence 1 (a kept prefix's cut after its
        tokens), shifted to its start and shared into sequence 0 (the K-shift runs at the next
        decode)."""
        L = self._L
        for part in context:
            if isinstance(part, Gap):
                continue  # no cells until recomputed in place
            state = part.state if isinstance(part, KeptPrefix) else part
            self._restore(state, CHUNK, ctx)
            if isinstance(part, KeptPrefix):
                L.llama_memory_seq_rm(mem, CHUNK, part.n_tokens, -1)
            elif part.start != part.saved_at:
                L.llama_memory_seq_add(mem, CHUNK, -1, -1, part.start - part.saved_at)
            L.llama_memory_seq_cp(mem, CHUNK, REQUEST, -1, -1)
            self._pin(CHUNK, -1, -1, mem)  # before the next part's cells are found room
            L.llama_memory_seq_rm(mem, CHUNK, -1, -1)

    # -- requests ------------------------------------------------------------------------
    def full_prefill(self, token_ids: list[int]) -> LlamaRequest:
        return self.batch_reference(token_ids, [])

    def batch_reference(self, token_ids: list[int], cuts: list[int]) -> LlamaRequest:
        """``token_ids`` decoded from position 0 in one decode call per span between ``cuts``:
        with a composed state's cuts, what composition would give if it changed nothing but
        the batch shapes (llama.cpp's batch-split floor); without cuts, full prefill."""
        if not token_ids:
            raise ValueError("nothing to prefill")
        ticket = self._take_context()
        bounds = [0, *sorted({c for c in cuts if 0 < c < len(token_ids)}), len(token_ids)]
        for first, end in zip(bounds, bounds[1:]):
            logits = self._decode(list(token_ids[first:end]), first, REQUEST)
            self._pin(REQUEST, first, end)
        return LlamaRequest(list(token_ids), logits, ticket, bounds[1:-1])

    def batch_floor(self, state: LlamaRequest) -> LlamaRequest:
        return self.batch_reference(state.token_ids, state.cuts)

    def recompute(self, context_ids: list[int], context: list[SequenceState],
                  selected: list[int], query_ids: list[int]) -> LlamaRequest:
        """Place every part, recompute ``selected`` positions as contiguous runs in request
        order, then decode the query. ``context`` itself is never modified."""
        L, mem = self._L, self._mem
        n = len(context_ids)
        if sum(part.n_tokens for part in context) != n:
            raise ValueError("context states do not cover the context ids")
        if n + len(query_ids) > self.n_ctx:
            raise ValueError(f"request of {n + len(query_ids)} tokens exceeds the llama.cpp "
                             f"context of {self.n_ctx}")
        selected = sorted(set(selected))
        if not query_ids and (not selected or selected[-1] != n - 1):
            selected.append(n - 1)  # its output is the next-token prediction
        gaps = {p for part in context if isinstance(part, Gap)
                for p in range(part.start, part.start + part.n_tokens)}
        if gaps and (self._scatter is None or not gaps <= set(selected)):
            raise ValueError("a gap's positions are recomputed in place, in scattered batches")
        ticket = self._take_context()
        runs = _runs(selected)
        cuts = self._reused_batches(context, runs)
        logits = None
        if self._scatter is not None and runs:
            logits = self._recompute_in_place(context, context_ids, selected, not query_ids)
            cuts += [cut for run in runs for cut in run]
            runs = []
        else:
            self._place(context, self._ctx, mem)
        for number, (first, end) in enumerate(runs):
            cuts += [first, end]
            if first > 0:
                L.llama_memory_seq_cp(mem, REQUEST, RUN, 0, first)
            # The run's stale cells go first: the fresh ones then fit in the same room.
            L.llama_memory_seq_rm(mem, REQUEST, first, end)
            self._unpin(first, end)
            # Logits only where they are read (the last run's, without a query): any other
            # run's would be computed and thrown away, and on Gemma 3 (262k vocabulary) the
            # output layer reads more weights than the rest of the model.
            wanted = "last" if not query_ids and number == len(runs) - 1 else "none"
            logits = self._decode(context_ids[first:end], first, RUN, logits=wanted)
            L.llama_memory_seq_cp(mem, RUN, REQUEST, first, end)
            self._pin(RUN, first, end)
            L.llama_memory_seq_rm(mem, RUN, -1, -1)
        if query_ids:
            logits = self._decode(list(query_ids), n, REQUEST)
            self._pin(REQUEST, n, n + len(query_ids))
        cuts = sorted({c for c in cuts if 0 < c < n} | ({n} if query_ids else set()))
        return LlamaRequest(list(context_ids) + list(query_ids), logits, ticket, cuts)

    def _recompute_in_place(self, context: list, context_ids: list[int], selected: list[int],
                            want_logits: bool) -> torch.Tensor | None:
        """Decode the ``selected`` positions in sequence 0 itself, at their own positions, in
        batches of ``RECOMPUTE_BATCH`` (the patched build's scattered batches), each batch's
        cells pinned before the next is given room. Parts are placed as the batches reach
        them, their selected positions' stale cells removed: without flash attention llama.cpp
        scores a batch against every cell there is, so an early batch then pays for the cells
        before it, not for the whole context."""
        L, mem = self._L, self._mem
        chosen = set(selected)
        placed = 0

        def place_through(position: int) -> None:
            nonlocal placed
            while placed < len(context) and context[placed].start <= position:
                part = context[placed]
                self._place([part], self._ctx, mem)
                inside = range(part.start, part.start + part.n_tokens)
                for first, end in _runs([p for p in inside if p in chosen]):
                    L.llama_memory_seq_rm(mem, REQUEST, first, end)
                    self._unpin(first, end)
                placed += 1

        logits = None
        self._scatter(True)
        try:
            size = min(RECOMPUTE_BATCH, self.n_batch)
            for first in range(0, len(selected), size):
                part = selected[first : first + size]
                place_through(part[-1])
                last = first + len(part) == len(selected)
                # Logits only where they are read: the last position, without a query.
                logits = self._decode([context_ids[p] for p in part], 0, REQUEST,
                                      logits="last" if want_logits and last else "none",
                                      positions=part)
                self._pin(REQUEST, part[0], part[-1] + 1)
        finally:
            self._scatter(False)
        place_through(len(context_ids))
        return logits

    def _reused_batches(self, context: list[SequenceState | KeptPrefix],
                        runs: list[tuple[int, int]]) -> list[int]:
        """Where the batches that made the reused cells began, in request positions: each part's
        start and a chunk state's prefill batch boundaries (every ``n_batch`` tokens from the
        start of that prefill), leaving out those inside a recomputed run (its own batches
        replace them). The batch-split floor decodes in the same batches: on Gemma 3 other
        batches alone move logits by up to 1 past a 512-token window (KL ~0.015)."""
        cuts = []
        for part in context:
            cuts.append(part.start)
            if isinstance(part, SequenceState):
                shift = part.start - part.saved_at
                cuts += [bound + shift for bound in range(self.n_batch, part.saved_at
                                                          + part.n_tokens, self.n_batch)
                         if bound > part.saved_at]
        return [cut for cut in cuts if not any(first < cut < end for first, end in runs)]

    def extend(self, state: LlamaRequest, token_ids: list[int]) -> torch.Tensor:
        """Append tokens to the state; returns logits for every appended position."""
        self._check(state)
        rows = self._decode(list(token_ids), state.length, REQUEST, logits="all")
        self._pin(REQUEST, state.length, state.length + len(token_ids))
        state.token_ids.extend(token_ids)
        state.logits = rows[-1]
        return rows

    def rewind(self, state: LlamaRequest, length: int, logits: torch.Tensor) -> None:
        self._check(state)
        self._L.llama_memory_seq_rm(self._mem, REQUEST, length, -1)
        self._unpin(length, -1)
        del state.token_ids[length:]
        state.logits = logits

    def score(self, state: LlamaRequest, target_ids: list[int]) -> float:
        """Mean NLL (nats/token) of ``target_ids`` following the state; the state is unchanged."""
        return mean_nll(self, state, target_ids)

    def generate(self, state: LlamaRequest, max_new_tokens: int) -> list[int]:
        """Greedy continuation; the state is left as it was."""
        self._check(state)
        length, first = state.length, state.logits
        out: list[int] = []
        for _ in range(min(max_new_tokens, self.n_ctx - length)):
            token = int(state.logits.argmax())
            if self._is_end(token):
                break
            out.append(token)
            self.extend(state, [token])
        self.rewind(state, length, first)
        return out

    def kv_bytes(self, state: LlamaRequest) -> int:
        self._check(state)
        return int(self._L.llama_state_seq_get_size(self._ctx, REQUEST))

    @property
    def end_token_ids(self) -> frozenset[int]:
        """The vocabulary's end-of-generation tokens (what ``generate`` stops at)."""
        if self._ends is None:
            self._ends = frozenset(t for t in range(self.n_vocab) if self._is_end(t))
        return self._ends

    def state_kv(self, state: LlamaRequest, n_tokens: int) -> SequenceState:
        """The request's first ``n_tokens`` cells saved as a sequence state at position 0."""
        self._check(state)
        if not 0 < n_tokens <= state.length:
            raise ValueError(f"{n_tokens} tokens of a state of {state.length}")
        L, mem = self._L, self._mem
        L.llama_memory_seq_cp(mem, REQUEST, CHUNK, 0, n_tokens)
        try:
            return self._save(CHUNK, n_tokens, 0)
        finally:
            L.llama_memory_seq_rm(mem, CHUNK, -1, -1)

    def head(self, kv: SequenceState, n_tokens: int) -> SequenceState:
        """``kv``'s first ``n_tokens`` cells (as ``span``)."""
        if not 0 < n_tokens <= kv.n_tokens:
            raise ValueError(f"{n_tokens} tokens of a sequence state of {kv.n_tokens}")
        return self.span(kv, 0, n_tokens)

    def span(self, kv: SequenceState, start: int, end: int) -> SequenceState:
        """Cells ``[start, end)`` of ``kv`` (counted from its first), at their positions:
        restored, cut and saved again (like ``prefill_chunk``, this takes the context, so an
        earlier request state is unusable)."""
        if not 0 <= start < end <= kv.n_tokens:
            raise ValueError(f"tokens {start}..{end} of a sequence state of {kv.n_tokens}")
        if (start, end) == (0, kv.n_tokens):
            return kv
        self._take_context()
        L, mem = self._L, self._mem
        self._restore(kv, CHUNK)
        L.llama_memory_seq_rm(mem, CHUNK, kv.saved_at + end, -1)
        if start:
            L.llama_memory_seq_rm(mem, CHUNK, kv.saved_at, kv.saved_at + start)
        try:
            return replace(self._save(CHUNK, end - start, kv.saved_at + start, alone=True),
                           start=kv.start + start)
        finally:
            L.llama_memory_seq_rm(mem, CHUNK, -1, -1)


THREADS_ENV = "CODEKV_LLAMA_THREADS"
# ggml's own limit (GGML_MAX_N_THREADS); llama.cpp's int32 field would wrap a larger number.
MAX_THREADS = 512


def threads_from_env() -> int | None:
    """``$CODEKV_LLAMA_THREADS``: ggml's threads spin at barriers, so on cores other work
    keeps busy fewer threads than cores can be much faster."""
    text = os.environ.get(THREADS_ENV)
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_THREADS:
        raise ValueError(f"{THREADS_ENV} must be a whole number from 1 to {MAX_THREADS}, "
                         f"not {text!r}")
    return int(text)


def _scatter_switch(L):
    """``llama_set_scattered_positions`` of the patched build, typed, or None."""
    switch = getattr(L.llama_cpp._lib, "llama_set_scattered_positions", None)
    if switch is not None:
        switch.argtypes, switch.restype = [ctypes.c_bool], None
    return switch


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted positions as maximal contiguous [first, end) runs."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def _model_desc(L, model) -> str:
    buf = ctypes.create_string_buffer(128)
    L.llama_model_desc(model, buf, len(buf))
    return buf.value.decode()


def _count(value) -> bool:
    """A JSON integer >= 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
