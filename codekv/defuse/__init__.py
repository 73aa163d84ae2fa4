"""The repository-wide def-use graph: which definition each reference resolves to.

Static anchors (call, branch, return, assign, def, import) are extracted per chunk from each
language's query (``codekv.analysis``); ``use`` anchors are references this graph resolved to a
definition in another chunk, so they depend on the whole repository and are derived per
snapshot. (The recompute rule that reads anchors is ``codekv.selection.anchors``.)
"""

from codekv.defuse.graph import DefUseGraph, Use, build_graph

__all__ = ["DefUseGraph", "Use", "build_graph"]
