"""``codekv serve``: an OpenAI-compatible server that reuses what clients re-send.

``app`` holds the HTTP routes, ``protocol`` the OpenAI wire types, ``chat`` the chat template's
rendering (client text kept as text), ``keys`` the API keys and their scopes, ``drain`` the
shutdown on SIGTERM, ``engine`` the request pipeline on the warm model, ``prefix`` the
exact-prefix cache of recent prompts, ``prompt_cache`` how each engine keeps them and what it
can do with them, ``segments`` how a prompt's reusable segments are found, classed and keyed,
``shift`` the shift-only baseline (llama-server's cache reuse), and ``command`` the command
line.
"""

# What a request may reuse: composition (the default), or one of the baselines the replay
# benchmark measures it against: an exact-prefix cache alone (llama-server without
# --cache-reuse), or llama-server's --cache-reuse shifting of the previous prompt's runs.
COMPOSE, EXACT_ONLY, SHIFT_ONLY = "compose", "exact-only", "shift-only"
REUSE_MODES = (COMPOSE, EXACT_ONLY, SHIFT_ONLY)
