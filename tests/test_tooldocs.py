"""Tool documentation is made from a repository's documented functions, as a client's tools."""

from __future__ import annotations

import ast
import json

from codekv.eval.tooldocs import MAX_DESCRIPTION, summary, tools
from codekv.serve.segments import tool_descriptions

SOURCE = '''
import typing


def resize(path: str, width: int, height: "int" = 0, *, keep: bool = True,
           mode: typing.Mapping[str, int] = None, fit=min, **rest) -> None:
    """Resize the image at a path,
    keeping its ratio.

    Whatever the format.

    Args:
        path: where the image is.
    """


async def fetch(url, retries=3):
    """Fetch a page.

    Parameters
    ----------
    url : str
    """


def _private(x):
    """Not a tool."""


def undocumented(x):
    return x


class Image:
    def crop(self, box):
        """A method: not a tool."""


def manual(x):
    """LONG"""
'''.replace("LONG", "word " * (MAX_DESCRIPTION // 5 + 1))


def test_a_public_documented_function_is_a_tool_with_its_summary_and_parameters():
    found = {tool.name: tool for tool in tools("img.py", ast.parse(SOURCE))}
    assert sorted(found) == ["fetch", "resize"]  # private, undocumented, methods, manuals: not
    resize = found["resize"]
    assert resize.path == "img.py"
    assert resize.spec == {"type": "function", "function": {
        "name": "resize",
        "description": "Resize the image at a path, keeping its ratio.\n\nWhatever the format.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "width": {"type": "integer"},
            "height": {"type": "integer", "default": 0},
            "keep": {"type": "boolean", "default": True}, "mode": {"type": "object",
                                                                   "default": None},
            "fit": {}}, "required": ["path", "width"]}}}
    assert found["fetch"].spec["function"]["description"] == "Fetch a page."
    fetch = found["fetch"].spec["function"]["parameters"]
    assert fetch["properties"] == {"url": {}, "retries": {"default": 3}}


def test_a_tool_s_text_is_one_the_server_finds_as_a_tool_description():
    for tool in tools("img.py", ast.parse(SOURCE)):
        assert json.loads(tool.text) == tool.spec
        assert tool.text in tool_descriptions([tool.spec])


def test_the_summary_ends_where_a_section_or_an_example_begins():
    assert summary("Add.\n\n:param a: the first") == "Add."
    assert summary("Add.\n\n>>> add(1, 2)\n3") == "Add."
    assert summary("Add two\nnumbers.\n\nReturns:\n    the sum") == "Add two numbers."
    assert summary("Add.\n\n    an indented block") == "Add."
    assert summary("Examples\n--------\nadd(1, 2)") == ""
