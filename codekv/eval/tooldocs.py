"""Tool documentation as agents send it: function tools (a chat request's ``tools``) made from a
repository's documented Python functions, so that tool docs, like code, are held out by
repository.

Each public module-level function with a docstring becomes a tool: its name, its docstring's
summary (the prose before a section such as ``Args:``, ``Parameters`` or ``:param``) as the
description, and its parameters (a JSON type where the annotation names one, a literal default).
Its text is the compact JSON a chat template's ``tojson`` writes, one of the forms the server
finds as a tool description (``codekv.serve.segments.tool_descriptions``).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

# Where a docstring's summary ends: a section of Google, NumPy or Sphinx style, or an example.
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|"
                      r"Notes?|See Also|Attributes|Keyword Arguments|Other Parameters|Warns?):?"
                      r"\s*$|^(:param|:type|:return|:rtype|:raises|>>>|\.\. )")
_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
               "list": "array", "tuple": "array", "set": "array", "Sequence": "array",
               "Iterable": "array", "dict": "object", "Mapping": "object"}
MAX_DESCRIPTION = 600  # characters: a tool's summary, not its manual


@dataclass(frozen=True)
class Tool:
    path: str  # the file defining the function
    name: str
    description: str
    spec: dict  # {"type": "function", "function": {...}}, as a client sends it

    @property
    def text(self) -> str:
        return json.dumps(self.spec, ensure_ascii=False)


def tools(path: str, tree: ast.Module) -> list[Tool]:
    """The tools of one parsed file: its public module-level functions with a summary."""
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name.startswith("_"):
            continue
        description = summary(ast.get_docstring(node) or "")
        if description:
            found.append(Tool(path, node.name, description, _spec(node, description)))
    return found


def summary(docstring: str) -> str:
    """The docstring's prose paragraphs before its first section, wrapped lines joined."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", docstring.strip()):
        lines = block.splitlines()
        if not lines or lines[0].startswith(" ") or _SECTION.match(lines[0].strip()):
            break
        paragraphs.append(" ".join(" ".join(lines).split()))
    text = "\n\n".join(paragraphs)
    return text if len(text) <= MAX_DESCRIPTION else ""


def _spec(node: ast.FunctionDef | ast.AsyncFunctionDef, description: str) -> dict:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]],
                        args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d})
    properties, required = {}, []
    for arg in [*positional, *args.kwonlyargs]:
        if arg.arg in ("self", "cls"):
            continue
        schema = {}
        kind = _json_type(arg.annotation)
        if kind:
            schema["type"] = kind
        if arg.arg in defaults:
            try:
                value = ast.literal_eval(defaults[arg.arg])
            except (ValueError, SyntaxError, TypeError):
                pass
            else:
                if value is None or isinstance(value, str | int | float | bool):
                    schema["default"] = value
        else:
            required.append(arg.arg)
        properties[arg.arg] = schema
    parameters = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": node.name, "description": description,
                                             "parameters": parameters}}


def _json_type(annotation: ast.expr | None) -> str | None:
    """The JSON type an annotation names (``str``, ``list[int]``, ``typing.Mapping``), if any."""
    if isinstance(annotation, ast.Subscript):
        annotation = annotation.value
    if isinstance(annotation, ast.Attribute):
        return _JSON_TYPES.get(annotation.attr)
    if isinstance(annotation, ast.Name):
        return _JSON_TYPES.get(annotation.id)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _JSON_TYPES.get(annotation.value.split("[")[0])
    return None
