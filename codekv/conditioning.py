"""What a chunk's stored KV is computed after - its conditioning - named here, without torch,
for the composer, the command line and the evaluation.

- ``none``: nothing; one entry per chunk whatever the request's prefix;
- ``prefix``: the request's exact prefix (a system prompt), so no chunk's first token acts as
  the start of a sequence; one entry per chunk and prefix (the default);
- ``graph``: that prefix, then the definitions the chunk uses (its def-use neighbours in the
  index, whole chunks, most-used first, up to ``GRAPH_TOKENS``), so the chunk's KV has already
  seen what it depends on (FusionRAG conditions on embedding neighbours; code has its graph).

Only the chunk's own tokens' KV is stored, keyed by everything it was computed after.
"""

from __future__ import annotations

CONDITIONINGS = ("none", "prefix", "graph")
DEFAULT_CONDITIONING = "prefix"
GRAPH_TOKENS = 512


def checked(conditioning: str) -> str:
    if conditioning not in CONDITIONINGS:
        raise ValueError(f"unknown conditioning {conditioning!r}; choose from "
                         + ", ".join(CONDITIONINGS))
    return conditioning
