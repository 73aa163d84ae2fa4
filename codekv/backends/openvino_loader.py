"""Loading a model on OpenVINO: the transformers engine's model (a GGUF converted once, or a
local Hugging Face directory), exported once to an OpenVINO IR kept in the model cache.

The IR is keyed by the transformers engine's model fingerprint (weights, dtype, RoPE) and the
transformers and OpenVINO versions: the exporter traces transformers' forward, so another
version of either may give another graph. Weights are kept in f32 (``save_model`` would
compress them to f16 by default).
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

from codekv import paths
from codekv.backends import hf_loader
from codekv.backends.engines import ModelLoadError


def load(model: Path, dtype: str = "float32", device: str | None = None):
    """An ``OpenVINOBackend`` for a GGUF file or a local Hugging Face directory (CPU, f32)."""
    try:
        import openvino as ov
    except ImportError as error:
        raise ModelLoadError("the openvino engine needs the 'openvino' extra "
                             "(pip install 'codekv[openvino]')") from error
    from codekv.backends.openvino import PRECISION, OpenVINOBackend, export

    if dtype != "float32":
        raise ModelLoadError(f"the openvino engine runs float32 models, not {dtype}")
    if device not in (None, "cpu", "CPU"):
        raise ModelLoadError(f"the openvino engine runs on the CPU, not {device}")
    hf = hf_loader.load(model, dtype)
    if hf._windows:
        raise ModelLoadError(f"the openvino engine does not run models with sliding-window "
                             f"layers yet ({hf.info.family}): its IR takes one attention mask")
    runtime = f"tf{metadata.version('transformers')}-ov{ov.get_version().split('-')[0]}"
    ir = paths.model_cache() / f"openvino-{hf.info.fingerprint[:16]}-{runtime}" / "model.xml"
    if not ir.is_file():
        _save(export(hf.model), ir)
    core = ov.Core()
    import torch

    settings = dict(PRECISION, INFERENCE_NUM_THREADS=torch.get_num_threads())
    compiled = core.compile_model(core.read_model(ir), "CPU", settings)
    # The transformers engine's fingerprint names the weights (a directory's are hashed once).
    return OpenVINOBackend(hf.model, hf.tokenizer, compiled,
                           weights_fingerprint=hf.info.fingerprint, leading_ids=hf.leading_ids,
                           runtime=runtime)


def _save(ir, target: Path) -> None:
    """The IR written whole: into a directory of its own, renamed into place."""
    import openvino as ov

    staging = target.parent.with_name(target.parent.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        paths.private_dir(staging)
        ov.save_model(ir, str(staging / target.name), compress_to_fp16=False)
        shutil.rmtree(target.parent, ignore_errors=True)
        staging.rename(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
