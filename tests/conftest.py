"""The test session's options and hooks. The fixtures and shared helpers are in tests/fixtures/
(models, repos, stores, servers, ...), registered here; test modules import helpers from there,
never from each other."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("fixtures")

from fixtures import needs  # noqa: E402 - after the rewrite hook, so its asserts explain

pytest_plugins = ["fixtures.models", "fixtures.repos", "fixtures.stores", "fixtures.servers"]

LLAMACPP = "llamacpp"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-llamacpp", action="store_true",
        help="run without the llama.cpp build: deselect the tests marked llamacpp and skip the "
             "modules that import llama_cpp, also under CI=true (make test-fast)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{LLAMACPP}: needs llama-cpp-python (the llama.cpp build); deselected by "
                   "--without-llamacpp")
    if config.getoption("--without-llamacpp"):
        needs.WITHOUT["llama_cpp"] = "--without-llamacpp"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--without-llamacpp"):
        return
    dropped = [item for item in items if item.get_closest_marker(LLAMACPP)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker(LLAMACPP)]
