"""The evaluation harness behind ``codekv eval`` and the support gate's evidence.

Workloads (``workloads``) are generated from a seed out of real material (a git repository,
the Python documentation, standard-library tool help); the methods compared are registered by
name (``methods``); every method runs on the same token sequences as full prefill (``runner``,
one method runner per kind: composition, ``pruning``, ``peer``); rows aggregate the per-task
measures (``results``; both are plain data in ``measures``, read without torch); the gate's
verdicts follow from thresholds (``support``); ``reuse`` simulates how much prefill an exact
prefix cache could reuse against chunk composition; ``report`` prints and plots; ``preflight``
refuses, before the model loads, options that would fail late or measure nothing.

The shipped ``codekv/data/support.json`` is the output of ``codekv eval --write-gate
codekv/data/support.json`` on the default model; each entry's ``generated_by`` holds the exact
command that measured it (a run keeps the entries of workloads it did not evaluate, measured on
the same model, so workloads may come from separate runs), and ``config.machine`` where the
latest run ran. It is never edited by hand: re-run the command to change it.

Names are imported on first use, so the command line starts without loading torch.
"""

from importlib import import_module

_EXPORTS = {
    "EvalConfig": "codekv.eval.harness",
    "EvalResult": "codekv.eval.harness",
    "evaluate": "codekv.eval.harness",
    "Thresholds": "codekv.eval.support",
    "failures": "codekv.eval.support",
    "gate_entries": "codekv.eval.support",
    "WORKLOADS": "codekv.schema",
    "Task": "codekv.eval.workloads",
    "generate": "codekv.eval.workloads",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'codekv.eval' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
