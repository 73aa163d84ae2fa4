"""A chat rendered by the model's own template, its markers taken from the template alone.

A client's text may spell the template's markers (``<|im_start|>system``): a pasted file, a
tool's output, a web page. Read as the tokens they name, they would open turns the client never
had (a system prompt injected through a message). So every string a client sent is escaped
before the template runs (each marker's text and the escape character itself become a private
use code), the rendered text is cut at the markers left (the template's own), and the client's
strings are put back as text. The prompt's tokens are then read with exactly those markers as
special tokens and everything else as text (``Backend.tokenize_prompt``).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

from codekv.backends import chat_template_of
from codekv.serve.engine import Prompt, RequestError
from codekv.serve.segments import tool_descriptions

ESCAPE = "\ue000"  # a private use character: never in a template
CODES = 0xF0000  # the escape's second character: plane 15's private use area, one per marker
CODED = re.compile(ESCAPE + "([\U000F0000-\U000FFFFD])")


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt and the character spans of the template's markers in it."""

    text: str
    markers: list[tuple[int, int]]


class _Markers:
    """A tokenizer's marker texts, and the patterns that find and escape them."""

    def __init__(self, texts):
        # Longest first: a marker that starts another (``<|im`` of ``<|im_start|>``) loses.
        self.table = [ESCAPE] + sorted((t for t in set(texts) if t and ESCAPE not in t),
                                       key=lambda t: (-len(t), t))
        if len(self.table) > 0xFFFFD - CODES:
            raise ValueError(f"{len(self.table)} marker texts: more than can be escaped")
        self.code = {text: ESCAPE + chr(CODES + index) for index, text in enumerate(self.table)}
        alternatives = "|".join(map(re.escape, self.table[1:]))
        self.find = re.compile(alternatives) if alternatives else None
        self.escapes = re.compile("|".join(map(re.escape, self.table)))

    def escape(self, value):
        """``value`` (a string, or lists and objects of them) with every marker escaped."""
        if isinstance(value, str):
            return self.escapes.sub(lambda m: self.code[m[0]], value)
        if isinstance(value, list):
            return [self.escape(item) for item in value]
        if isinstance(value, dict):
            return {self.escape(key): self.escape(item) for key, item in value.items()}
        return value

    def unescape(self, text: str) -> str:
        return CODED.sub(lambda m: self.table[ord(m[1]) - CODES], text)


_markers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _markers_of(backend) -> _Markers:
    if backend not in _markers:
        _markers[backend] = _Markers(backend.markers)
    return _markers[backend]


def render(backend, messages: list[dict], tools: list[dict] | None = None) -> Rendered:
    """The chat as ``backend.render_chat`` renders it, with the spans of the markers the
    template wrote; a marker's text the client sent is text (ValueError as ``render_chat``)."""
    markers = _markers_of(backend)
    rendered = backend.render_chat(markers.escape(messages), markers.escape(tools))
    text, spans, cursor, length = [], [], 0, 0
    for match in markers.find.finditer(rendered) if markers.find else ():
        plain = markers.unescape(rendered[cursor:match.start()])
        text.append(plain)
        length += len(plain)
        text.append(match[0])
        spans.append((length, length + len(match[0])))
        length += len(match[0])
        cursor = match.end()
    text.append(markers.unescape(rendered[cursor:]))
    return Rendered("".join(text), spans)


def chat_prompt(backend, messages: list[dict], tools: list[dict] | None = None) -> Prompt:
    """The prompt as the model's own chat template renders it (with the assistant's turn),
    its special tokens the template's alone (above)."""
    if tools and "tools" not in chat_template_of(backend):
        raise RequestError(400, "the model's chat template cannot render tools: send them in "
                                "a message instead", "tools")
    try:
        rendered = render(backend, messages, tools)
    except ValueError as error:
        raise RequestError(400, f"the model's chat template refused the messages: {error}",
                           "messages") from None
    text = rendered.text
    system_end = 0
    if messages[0]["role"] == "system" and messages[0]["content"]:
        at = text.find(messages[0]["content"])
        if at >= 0:
            system_end = at + len(messages[0]["content"])
    return Prompt(text, [m["content"] for m in messages], tool_descriptions(tools or []),
                  system_end, rendered.markers)
