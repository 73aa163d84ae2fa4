"""``codekv serve``: an OpenAI-compatible server that reuses what clients re-send.

``app`` holds the HTTP routes, ``engine`` the request pipeline on the warm model, ``prefix``
the exact-prefix cache of recent prompts, ``segments`` how a prompt's reusable segments are
found, classed and keyed, and ``command`` the command line.
"""
