"""Option types the command line shares (``codekv.cli`` and ``codekv.eval.command``)."""

from __future__ import annotations

from pathlib import Path

import click


class StoreParam(click.ParamType):
    """A directory (a Path), or with ``shared``, a shared chunk KV store spec (a str): a value
    with ``://`` is a URL and is never taken for a directory."""

    name = "store"

    def __init__(self, shared: bool):
        self.shared = shared

    def convert(self, value, param, ctx):
        from codekv.stores import StoreSpecError, check_spec, is_shared_spec

        if isinstance(value, Path) or not is_shared_spec(value):
            return click.Path(file_okay=False, path_type=Path).convert(value, param, ctx)
        if not self.shared:
            self.fail("a URL names a shared chunk KV store; the index needs a directory")
        try:
            check_spec(value)
        except StoreSpecError as error:
            self.fail(str(error))
        return value
