"""Tool documentation is read from the options of argparse help."""

from __future__ import annotations

import argparse

from codekv.eval.tooldocs import COLUMNS, parse_options


def test_help_options_are_parsed_from_argparse_output(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("-b", "--bind", metavar="ADDRESS",
                        help="bind to this address (default: all interfaces); a long help "
                             "text that argparse wraps onto a second line")
    parser.add_argument("--cgi", action="store_true", help="run as CGI server")
    parser.add_argument("-q", action="store_true", help="quiet")
    parser.add_argument("port", help="the port")
    options = {o.flags: o.help for o in parse_options(parser.format_help())}
    assert options == {
        ("-h", "--help"): "show this help message and exit",
        ("-b", "--bind"): "bind to this address (default: all interfaces); a long help text "
                          "that argparse wraps onto a second line",
        ("--cgi",): "run as CGI server",
        ("-q",): "quiet",
    }
