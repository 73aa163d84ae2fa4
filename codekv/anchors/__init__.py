"""Code anchors and the repository-wide def-use graph.

Static anchors (call, branch, return, assign, def, import) come from each language's query and
are stored per chunk; ``use`` anchors are references the def-use graph resolved to a definition
in another chunk, so they depend on the whole repository and are derived per snapshot.
"""

from codekv.anchors.graph import DefUseGraph, Use, build_graph

__all__ = ["DefUseGraph", "Use", "build_graph"]
