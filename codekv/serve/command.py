"""``codekv serve``: load the model, the index and the store once, then serve HTTP."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import click

from codekv.backends.engines import ENGINES, TRANSFORMERS, engines_help
from codekv.cli_types import StoreParam
from codekv.selection import STRATEGIES
from codekv.serve import COMPOSE, REUSE_MODES

LOOPBACK = {"localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _repo_code(repos: tuple[str, ...], index_dir: Path | None) -> frozenset[str]:
    """The digests of every indexed chunk's and file's text of the served repositories: a
    message holding one of them is code, whatever its fences say."""
    from codekv.gitrepo import NotARepositoryError
    from codekv.index import Index
    from codekv.index_db import CorruptIndexError
    from codekv.serve.segments import known_code_digests

    texts = []
    for repo in repos:
        try:
            index = Index(repo, store=index_dir)
        except (NotARepositoryError, CorruptIndexError) as error:
            raise click.ClickException(f"--repo {repo}: {error}") from error
        try:
            index.update()
            for chunk in index.chunks():
                texts.append(index.text(chunk).decode("utf-8", "replace"))
            for file in index.files():
                try:
                    texts.append((Path(index.root) / file.path).read_text())
                except (OSError, UnicodeDecodeError):
                    continue
        finally:
            index.close()
    return known_code_digests(texts)


@click.command("serve")
@click.option("--repo", "repos", multiple=True,
              help="A git repository whose indexed chunks and files count as code when a "
                   "prompt holds them (repeatable).")
@click.option("--model", default=None, help="Local HF model directory or GGUF file "
                                            "[the default SmolLM2-135M-Instruct].")
@click.option("--backend", "engine", default=TRANSFORMERS, show_default=True,
              type=click.Choice(sorted(ENGINES)),
              help=engines_help())
@click.option("--served-model-name", default=None,
              help="The model id clients name [the model file's or directory's name].")
@click.option("--store", type=StoreParam(shared=True), default=None,
              help="Chunk KV store: a directory, redis://[user:password@]host:port/db, "
                   "rediss://..., or local,<url> (default: $CODEKV_STORE, else the codekv "
                   "home's).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --api-key.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", "api_keys", multiple=True,
              help="A key clients must send (Authorization: Bearer KEY); each key has its own "
                   "chunk store scope (repeatable; also $CODEKV_API_KEY).")
@click.option("--experimental", is_flag=True,
              help="Reuse every segment class, even where the support gate has no evidence.")
@click.option("--strategy", default="auto", show_default=True,
              type=click.Choice(["auto", *STRATEGIES]),
              help="Selection rule for composed segments; auto: the support gate's.")
@click.option("--ratio", type=click.FloatRange(0, 1), default=None,
              help="Share of reused tokens to recompute with a named strategy [0.15].")
@click.option("--min-segment-tokens", default=32, show_default=True,
              type=click.IntRange(min=1), help="Smallest block reused as a segment.")
@click.option("--max-queue", default=16, show_default=True, type=click.IntRange(min=1),
              help="Requests that may wait for the model; beyond them 503 with Retry-After.")
@click.option("--reuse", default=COMPOSE, show_default=True, type=click.Choice(REUSE_MODES),
              help="What a prompt may reuse: compose (exact prefix, then stored segments), "
                   "exact-only (the exact prefix alone), shift-only (the previous prompt's "
                   "runs of --min-segment-tokens shifted into place, as llama-server's "
                   "--cache-reuse); the last two are baselines for benchmarks/bench_serve.py.")
@click.option("--prefix-cache-mb", default=2048, show_default=True, type=click.IntRange(min=0),
              help="Memory for recent prompts' KV (the exact-prefix cache).")
def serve_command(repos, model, engine, served_model_name, store, host, port, api_keys,
                  experimental, strategy, ratio, min_segment_tokens, max_queue, reuse,
                  prefix_cache_mb):
    """Serve the model over an OpenAI-compatible HTTP API, reusing what clients re-send."""
    from codekv import paths
    from codekv.serve.keys import key_refusal, key_secret
    from codekv.stores import SCOPE_ENV, StoreSpecError, default_kv_store

    keys = [k for k in (*api_keys, os.environ.get("CODEKV_API_KEY", "")) if k]
    for number, key in enumerate(keys, 1):
        if refusal := key_refusal(key):
            raise click.ClickException(f"API key {number} of {len(keys)} {refusal}: a client "
                                       "could never send it (Authorization: Bearer KEY carries "
                                       "printable ASCII without spaces)")
    if not is_loopback(host) and not keys:
        raise click.ClickException(f"--host {host} is reachable from other machines: give "
                                   "--api-key (or bind 127.0.0.1)")
    if ratio is not None and strategy == "auto":
        raise click.ClickException("--ratio needs a named --strategy (auto takes the support "
                                   "gate's)")
    try:
        import uvicorn

        from codekv.serve.app import create_app
        from codekv.serve.drain import Drain, DrainingServer
        from codekv.serve.engine import Engine
    except ImportError as error:
        raise click.ClickException(f"codekv serve needs the 'serve' extra: pip install "
                                   f"'codekv[serve]' ({error})") from error
    from codekv.gate import SupportGate
    from codekv.models import ModelLoadError, load_backend

    index_dir, shared = (None, store) if isinstance(store, str) else (store, None)
    try:
        kv_store = default_kv_store(index_dir or paths.home(), shared)
    except StoreSpecError as error:
        raise click.ClickException(f"--store: {error}") from error
    known_code = _repo_code(repos, index_dir)
    try:
        backend = load_backend(model, engine=engine)
    except ModelLoadError as error:
        raise click.ClickException(str(error)) from error
    gate = SupportGate.load()
    try:
        pipeline = Engine(backend, kv_store, gate, experimental=experimental,
                          strategy=strategy, ratio=ratio, min_segment_tokens=min_segment_tokens,
                          known_code=known_code, max_queue=max_queue,
                          prefix_budget_bytes=prefix_cache_mb << 20, reuse=reuse)
    except ValueError as error:  # a --reuse the engine cannot serve
        raise click.ClickException(f"--reuse {reuse}: {error}") from error
    name = served_model_name or _model_name(model)
    scope = os.environ.get(SCOPE_ENV) or "serve"
    drain = Drain(lambda: not pipeline.busy and not pipeline.waiting)
    app = create_app(pipeline, name, keys, scope, key_secret(index_dir or paths.home()), drain)
    click.echo(f"codekv serve: http://{host}:{port}/v1, model {name!r}, store "
               f"{kv_store.location}, {len(keys)} API key(s)"
               + (f"; gate: {gate.error}" if gate.error else "")
               + ("" if backend.chat_template else
                  "; the model ships no chat template: chats are rendered as ChatML"), err=True)
    try:
        # SIGTERM drains what is in flight first (codekv.serve.drain), then uvicorn shuts down.
        DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                      timeout_graceful_shutdown=5), drain).run()
    finally:
        pipeline.close()


def _model_name(model: str | None) -> str:
    if model is None:
        from codekv.tokens import DEFAULT_GGUF

        return Path(DEFAULT_GGUF).name.split(".")[0]
    return Path(model).name.removesuffix(".gguf")
