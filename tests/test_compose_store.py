"""The chunk KV store as the composer and `codekv gc` use it: retiring, failing writes."""

import pytest
from click.testing import CliRunner

import codekv.index
from codekv.cli import main
from codekv.compose import Composer, Passage
from codekv.gate import SupportGate
from codekv.index import Index
from codekv.stores import default_kv_store
from codekv.tokens import CounterSpec


def test_gc_drops_kv_of_replaced_blobs_only(tiny_backend, git_repo, tmp_path, monkeypatch):
    monkeypatch.setattr(codekv.index, "default_counter_spec", lambda: CounterSpec("bytes"))
    store = tmp_path / "store"
    git_repo.commit(
        {"a.py": "def alpha(x):\n    return x * 2\n", "b.py": "def beta():\n    return 1\n"}
    )
    index = Index(git_repo.root, store=store, counter=CounterSpec("bytes"))
    index.update()
    kv = default_kv_store(store)
    composer = Composer(tiny_backend("llama"), index, kv, gate=SupportGate([], "test"),
                        experimental=True)
    assert composer.prefill(["a.py::alpha", "b.py::beta", Passage("some notes")]) == (3, 0)
    index.close()
    assert kv.stats().entries == 3

    git_repo.commit({"a.py": "def alpha(x):\n    return x * 3\n"})
    result = CliRunner().invoke(main, ["index", str(git_repo.root), "--store", str(store)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert "1 chunk KV files" in result.output
    # beta's KV and the passage stay; alpha's old blob is gone.
    remaining = default_kv_store(store)
    assert remaining.stats().entries == 2


def test_a_failing_store_write_does_not_fail_the_request(tiny_backend, tmp_path, monkeypatch):
    store = default_kv_store(tmp_path)

    def disk_full(key, entry):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "put", disk_full)
    composer = Composer(tiny_backend("llama"), store=store, gate=SupportGate([], "test"),
                        experimental=True)
    result = composer.compose([Passage("alpha beta"), Passage("gamma")], "delta?", strategy="all")
    assert result.status == "composed"
    assert result.report.chunk_misses == 2
    assert composer.counters.store_errors == {"OSError": 2}


def test_prefill_refuses_a_passage_longer_than_the_model_up_front(tiny_backend, tmp_path):
    """No request could use the KV of a passage past the model's positions: nothing is
    computed or stored, the short passage before it included."""
    backend = tiny_backend("llama")
    store = default_kv_store(tmp_path)
    composer = Composer(backend, store=store, gate=SupportGate([], "test"), experimental=True)
    long = Passage("alpha beta gamma " * backend.info.max_positions, name="manual")
    with pytest.raises(ValueError, match=f"than the model's {backend.info.max_positions} pos"):
        composer.prefill([Passage("short"), long])
    assert store.stats().entries == 0
    assert composer.prefill([Passage("short")]) == (1, 0)


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), -0.1, 1.5, "0.2"])
def test_compose_refuses_a_ratio_outside_0_to_1(tiny_backend, tmp_path, ratio):
    composer = Composer(tiny_backend("llama"), store=default_kv_store(tmp_path),
                        gate=SupportGate([], "test"), experimental=True)
    with pytest.raises(ValueError, match="ratio must be a number from 0 to 1"):
        composer.compose([Passage("alpha")], "beta?", strategy="boundary", ratio=ratio)
