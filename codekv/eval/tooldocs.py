"""Real tool documentation: the ``--help`` of standard-library modules that have a command line.

The help text is captured from ``python -m MODULE --help`` of the running interpreter (argparse
and optparse output, written by the CPython developers, not by us), with a fixed terminal width
so the wrapping, and hence every workload built from it, is the same on every run.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Modules whose ``--help`` only prints help (argparse/optparse). Others (e.g. platform, filecmp,
# pyclbr) run code on ``-m`` whatever the arguments, so they are not on the list.
TOOL_MODULES = (
    "json.tool", "http.server", "zipfile", "tarfile", "gzip", "py_compile", "compileall", "ast",
    "tokenize", "inspect", "pickletools", "trace", "zipapp", "venv", "unittest", "doctest",
    "cProfile", "profile", "calendar", "pickle", "ensurepip", "uu",
)
COLUMNS = 80


@dataclass(frozen=True)
class ToolOption:
    flags: tuple[str, ...]  # e.g. ("-b", "--bind")
    help: str  # the option's help, wrapped lines joined

    @property
    def name(self) -> str:
        """The long flag when there is one: what a question about the option expects."""
        long = [f for f in self.flags if f.startswith("--")]
        return long[0] if long else self.flags[0]


@dataclass(frozen=True)
class ToolDoc:
    module: str
    text: str
    options: tuple[ToolOption, ...]

    @property
    def command(self) -> str:
        return f"python -m {self.module}"


def capture_help(module: str, timeout: float = 20.0) -> str | None:
    """``python -m module --help`` of this interpreter, or None when it gives nothing usable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(COLUMNS=str(COLUMNS), LINES="50", NO_COLOR="1", PYTHON_COLORS="0", LC_ALL="C.UTF-8")
    with tempfile.TemporaryDirectory() as cwd:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-m", module, "--help"], cwd=cwd, env=env,
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
    text = done.stdout.strip()
    return text + "\n" if done.returncode == 0 and text else None


_OPTION_LINE = re.compile(r"^ {2}(-\S.*?)(?: {2,}(\S.*))?$")


def parse_options(text: str) -> list[ToolOption]:
    """The options of an argparse/optparse help text, with their help joined across lines."""
    options: list[ToolOption] = []
    flags: tuple[str, ...] | None = None
    parts: list[str] = []

    def flush():
        nonlocal flags, parts
        if flags and parts:
            options.append(ToolOption(flags, " ".join(parts)))
        flags, parts = None, []

    for line in text.splitlines():
        match = _OPTION_LINE.match(line)
        if match:
            flush()
            flags = _flags(match.group(1))
            parts = [match.group(2).strip()] if match.group(2) else []
        elif flags and line.startswith("   ") and line.strip()[:1] not in ("", "-"):
            parts.append(line.strip())
        else:
            flush()
    flush()
    return options


def _flags(invocation: str) -> tuple[str, ...]:
    """``-b ADDRESS, --bind ADDRESS`` -> ("-b", "--bind"); ``--out=FILE`` -> ("--out",)."""
    flags = []
    for piece in invocation.split(", "):
        flag = re.split(r"[ =]", piece.strip(), maxsplit=1)[0]
        if flag.startswith("-") and len(flag) > 1:
            flags.append(flag)
    return tuple(flags)


@functools.lru_cache(maxsize=1)
def tool_docs(modules: tuple[str, ...] = TOOL_MODULES) -> tuple[ToolDoc, ...]:
    """Every listed module's help that has options, in list order (captured once per process)."""
    docs = []
    for module in modules:
        text = capture_help(module)
        if text is None:
            continue
        options = tuple(o for o in parse_options(text) if "--help" not in o.flags)
        if options:
            docs.append(ToolDoc(module, text, options))
    return tuple(docs)
