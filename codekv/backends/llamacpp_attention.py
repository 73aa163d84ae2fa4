"""The query's attention read inside llama.cpp, through ggml's scheduler eval callback.

llama.cpp hands every node of a decode graph to ``llama_context_params.cb_eval``: asked first
whether it wants the tensor (``ask``), then called with it computed. Without flash attention a
layer's softmaxed attention is the node ``kq_soft_max-<layer>``, f32 laid out
``[n_kv, n_tokens, n_head, n_stream]`` over the KV cells the decode saw; its second source is
the mask ``[n_kv, n_tokens, 1, n_stream]`` (0 where a row sees a cell, -inf where not). Only the
probe layers' softmax is asked for, and the callback lives on a context of its own (a Python
call per graph node would slow every ordinary decode: ~1,100 nodes per SmolLM2 decode). After
the last probe layer the callback stops the graph, so the probe pays for those layers only.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import torch

F32 = 0  # ggml_type
SOFTMAX = re.compile(rb"kq_soft_max-(\d+)")


class _Tensor(ctypes.Structure):
    """``struct ggml_tensor`` (ggml.h, GGML_MAX_DIMS 4, GGML_MAX_SRC 10, GGML_MAX_NAME 64);
    checked against ``ggml_get_name`` before a tensor's fields are trusted."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10),
                ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _ggml():
    """The ggml library the wheel ships, with the few functions the reader calls typed."""
    from llama_cpp import _ggml

    lib = _ggml.libggml
    lib.ggml_get_name.restype, lib.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_nbytes.restype, lib.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_size_t]
    return lib


class AttentionReader:
    """The eval callback of a probe context: idle (it wants nothing) until ``arm`` gives
    it the layers to read; then it sums, per layer and KV cell, the attention of every query
    row and head. ``callback`` must stay referenced as long as the context lives (a collected
    ctypes callback crashes the next decode): this object holds it."""

    def __init__(self, L, window: int = 0):
        self._ggml = _ggml()
        self._window = window  # a sliding-window layer's rows see only that many cells
        self.callback = L.ggml_backend_sched_eval_callback(self._on_node)
        self._layers: frozenset[int] = frozenset()
        self._layers_read: frozenset[int] = frozenset()
        self._n_context = 0
        self._sums: dict[int, np.ndarray] = {}
        self._rows: dict[int, int] = {}
        self._heads = 0
        self._error: Exception | None = None

    def arm(self, layers: tuple[int, ...], n_context: int) -> None:
        """Read ``layers``' attention over cells ``[0, n_context)`` in the decodes that follow;
        the query rows are the cells after them (the probe context is laid out that way)."""
        self._layers, self._n_context = frozenset(layers), n_context
        self._sums = {layer: np.zeros(n_context) for layer in layers}
        self._rows = dict.fromkeys(layers, 0)
        self._heads, self._error = 0, None

    def disarm(self) -> None:
        """Stop reading: later decodes pay one cheap call per node."""
        self._layers_read, self._layers = self._layers, frozenset()

    def relevance(self, n_query: int) -> torch.Tensor:
        """Mean attention per context cell over the ``n_query`` query rows, heads and layers
        read since ``arm``. Raises RuntimeError where a layer's attention was not seen whole or
        not laid out as expected."""
        if self._error is not None:
            raise RuntimeError(f"reading llama.cpp attention failed: {self._error}")
        layers = sorted(self._layers_read)
        unseen = [layer for layer in layers if self._rows[layer] != n_query]
        if unseen:
            raise RuntimeError(
                f"llama.cpp showed no attention probabilities (kq_soft_max) for layers {unseen}: "
                "flash attention or a fused graph hides them")
        total = sum(self._sums[layer] for layer in layers) / (len(layers) * n_query * self._heads)
        return torch.from_numpy(total).float()

    def _on_node(self, tensor, ask, user_data) -> bool:
        if not self._layers:
            return not ask  # idle: want nothing, and never stop a computation
        try:
            match = SOFTMAX.fullmatch(self._ggml.ggml_get_name(tensor))
            wanted = match is not None and int(match[1]) in self._layers
            if ask:
                return wanted
            if wanted:
                self._read(tensor, int(match[1]))
                # The layers above the last probe layer are not needed: False stops this
                # graph (the probe context's later layers are left stale; it is cleared first).
                return int(match[1]) != max(self._layers)
        except Exception as error:  # a callback must not raise into C: kept, raised after
            self._error = self._error or error
        return True

    def _read(self, pointer: int, layer: int) -> None:
        tensor = _Tensor.from_address(pointer)
        if tensor.name != self._ggml.ggml_get_name(pointer):
            raise RuntimeError("ggml_tensor layout differs from the one this reader knows")
        n_kv, n_tokens, n_head, n_stream = tensor.ne
        if tensor.type != F32 or tensor.nb[0] != 4 or n_stream != 1:
            raise RuntimeError(f"kq_soft_max-{layer} is not one f32 stream "
                               f"(type {tensor.type}, ne {list(tensor.ne)})")
        probs = self._get(pointer, (n_head, n_tokens, n_kv))
        first = self._rows[layer]
        if layer == min(self._layers):
            self._check_cells(tensor.src[1], n_kv, n_tokens, first)
        n = self._n_context
        self._sums[layer] += probs[:, :, :n].sum(axis=(0, 1), dtype=np.float64)
        self._rows[layer] += n_tokens
        self._heads = n_head

    def _check_cells(self, mask_pointer: int | None, n_kv: int, n_tokens: int, first: int):
        """Query row ``first + j`` must see exactly cells ``[0, n_context + first + j]``: the
        context in cells 0.. and the query after it (in a sliding-window layer, the window's
        last cells of those). Anything else maps cells wrongly."""
        if not mask_pointer:
            raise RuntimeError("kq_soft_max has no mask to tell which cells a row sees")
        mask = _Tensor.from_address(mask_pointer)
        if mask.type != F32 or tuple(mask.ne) != (n_kv, n_tokens, 1, 1):
            raise RuntimeError(f"unexpected attention mask (type {mask.type}, "
                               f"ne {list(mask.ne)})")
        seen = np.isfinite(self._get(mask_pointer, (n_tokens, n_kv)))
        ends = self._n_context + first + np.arange(n_tokens) + 1
        cells = np.arange(n_kv)[None, :]
        expected = cells < ends[:, None]
        windowed = expected & (cells >= ends[:, None] - self._window)
        if not (np.array_equal(seen, expected)
                or self._window and np.array_equal(seen, windowed)):
            raise RuntimeError("the probe's KV cells are not the context then the query in "
                               "position order")

    def _get(self, pointer: int, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype=np.float32)
        if self._ggml.ggml_nbytes(pointer) != out.nbytes:
            raise RuntimeError(f"tensor of {self._ggml.ggml_nbytes(pointer)} bytes, "
                               f"expected {out.nbytes}")
        self._ggml.ggml_backend_tensor_get(pointer, out.ctypes.data, 0, out.nbytes)
        return out
