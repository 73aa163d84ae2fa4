"""``python -m codekv``: the command line, for environments without the ``codekv`` script."""

from codekv.cli import main

main(prog_name="codekv")
