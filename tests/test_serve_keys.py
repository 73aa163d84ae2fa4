"""``codekv serve``'s API keys: a key no client could send is refused at start-up, and the
scope a key names is an HMAC under a secret kept owner-only beside the store, so the store shows
nothing of the key, and a restarted server on the same store finds its scope's entries again."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys

import pytest
from fixtures.needs import require
from fixtures.servers import TINY, ServeProcess

KEY = "sk-test-0123456789abcdef"
FILE = ("class Rectangle:\n    def area(self, width, height):\n        return width * height\n\n"
        "    def perimeter(self, width, height):\n        return 2 * (width + height)\n")


@pytest.mark.parametrize("key, reason", [
    (" sk-lead", "starts or ends with a space"),
    ("sk-trail ", "starts or ends with a space"),
    ("sk-clé", "not ASCII"),
    ("sk two", "holds a space"),
    ("sk\ttab", "control character"),
])
def test_a_key_no_client_could_send_is_refused(key, reason):
    from codekv.serve.keys import key_refusal

    assert reason in key_refusal(key)


def test_a_key_a_client_can_send_is_accepted():
    from codekv.serve.keys import key_refusal

    assert key_refusal("sk-AZaz09._~+/=!#$%&*") is None


@pytest.mark.parametrize("where", ["option", "environment"])
def test_the_server_refuses_such_a_key_at_start_up_without_showing_it(where, tmp_path):
    key = " sk-sécret"
    environment = {**os.environ, "CODEKV_HOME": str(tmp_path)}
    args = ["--api-key", "fine-key"]
    if where == "option":
        args += ["--api-key", key]
    else:
        environment["CODEKV_API_KEY"] = key
    done = subprocess.run([sys.executable, "-c", "from codekv.cli import main; main()",
                           "serve", "--port", "0", *args], env=environment, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "API key 2 of 2 starts or ends with a space" in done.stderr
    assert "sécret" not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_a_key_s_scope_shows_nothing_of_it_and_survives_a_restart(tiny_model_dir, tmp_path):
    require("openai", "the openai client is not installed (the 'serve' extra)")
    from codekv.serve.keys import SECRET_FILE, scope_of_key
    from codekv.stores.entry import header_length, header_meta, recorded_scope

    home = tmp_path / "home"
    args = ["--model", str(tiny_model_dir), "--served-model-name", TINY, "--api-key", KEY,
            "--min-segment-tokens", "8", "--experimental"]
    messages = [{"role": "system", "content": "You review code."},
                {"role": "user", "content": f"Look.\n```python\n{FILE}```\nWhat is it?"}]

    def ask(server) -> dict:
        reply = server.client(KEY).chat.completions.create(
            model=TINY, messages=messages, temperature=0, max_tokens=2)
        return reply.model_extra["codekv"]

    def scopes() -> set[str]:
        found = set()
        for entry in (home / "kv").rglob("*.safetensors"):
            head = entry.read_bytes()
            found.add(recorded_scope(header_meta(head[:8 + (header_length(head[:8]) or 0)])))
        return found

    server = ServeProcess(args, home).wait()
    try:
        assert ask(server)["segments_stored"] >= 1
    finally:
        server.stop()
    secret = home / SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    scope = scope_of_key(KEY, bytes.fromhex(secret.read_text().strip()))
    assert scopes() == {scope}
    # Nothing in the store is the key's plain digest (the old scope name) or the key itself.
    plain = hashlib.sha256(KEY.encode()).hexdigest()[:16]
    for path in (home / "kv").rglob("*"):
        assert plain not in str(path) and KEY not in str(path)
        if path.is_file():
            data = path.read_bytes()
            assert plain.encode() not in data and KEY.encode() not in data
    again = ServeProcess(args, home).wait()
    try:
        report = ask(again)
    finally:
        again.stop()
    assert report["status"] == "composed" and report["reused_tokens"] > 0
    assert report["segments_from_last_prompt"] == 0  # from the store: the new process has none
