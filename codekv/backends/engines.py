"""The engine registry: engine name -> how to load a model on it.

Torch-free, so the command line, the support gate and the evaluation's option parsing read
engine names without loading a model runtime. A new engine is one module with a ``load``
function plus one line in ``ENGINES``; its module is imported only when the engine is loaded.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

TRANSFORMERS, LLAMA_CPP, OPENVINO = "transformers", "llama.cpp", "openvino"


class ModelLoadError(Exception):
    """The model cannot be loaded (missing, not a model, or would need a download)."""


@dataclass(frozen=True)
class Engine:
    """One engine: its name and ``loader``, ``"module:function"`` taking
    ``(model: Path, dtype: str, device: str | None)`` and returning a ``Backend``."""

    name: str
    loader: str
    # The model files it runs: "gguf" (a GGUF file), "hf-directory" (a local Hugging Face
    # model directory); a test picks a tiny model of a format the engine runs.
    formats: tuple[str, ...]
    # What a selection rule may need (its ``needs_*`` flag) that this engine cannot give, in
    # words: the support gate reads it without loading the engine; the backend refuses the same
    # rules (``deviation_refusal`` / ``relevance_refusal``; tests/test_gate.py checks they agree).
    unserved: tuple[tuple[str, str], ...] = ()
    # How ``codekv serve`` keeps recent prompts on it: "module:class", a
    # ``codekv.serve.prompt_cache.PromptCache`` taking ``(backend, budget_bytes)``.
    prompt_cache: str = "codekv.serve.prompt_cache:KVPrompts"
    about: str = ""  # what it runs, for the command line's --backend help

    def load(self, model: Path, dtype: str = "float32", device: str | None = None):
        module, _, function = self.loader.partition(":")
        return getattr(importlib.import_module(module), function)(model, dtype, device)


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    ENGINES[engine.name] = engine
    return engine


def engines_help() -> str:
    """The command line's ``--backend`` help: each engine and what it runs."""
    return "Engine: " + "; ".join(f"{e.name} ({e.about})" if e.about else e.name
                                  for e in ENGINES.values()) + "."


register(Engine(TRANSFORMERS, "codekv.backends.hf_loader:load", ("gguf", "hf-directory"),
                about="PyTorch"))
register(Engine(LLAMA_CPP, "codekv.backends.llamacpp_loader:load", ("gguf",),
                unserved=(("needs_deviation", "per-token KV deviation"),),
                prompt_cache="codekv.serve.prompt_cache:KeptStates",
                about="runs the GGUF as it is; the llamacpp extra"))
# The same models as transformers, their forward run as an OpenVINO IR (CPU, f32); the probes
# that choose what to recompute run in PyTorch on the same weights.
register(Engine(OPENVINO, "codekv.backends.openvino_loader:load", ("gguf", "hf-directory"),
                about="the forward as an OpenVINO IR on the CPU; the openvino extra"))
