"""``adaptrack serve --replicas N`` (issue 48): two replicas of a toy model on a local Ray
Serve (2 CPUs, no dashboard, started once for the module: about 20 s), behind the front on
127.0.0.1, driven by the ``openai`` client and raw HTTP. The toy model sleeps a little per
call so that concurrent requests overlap.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import socket
import sys
import threading
import time
import zlib

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the serve tests use the openai client")
uvicorn = pytest.importorskip("uvicorn", reason="adaptrack serve needs the serve extra")

import adaptrack as at  # noqa: E402
from adaptrack.cli import main  # noqa: E402
from adaptrack.cli.serve import listen  # noqa: E402

NAMES = {"replica-0", "replica-1"}
VOCAB = [chr(c) for c in range(32, 127)] + ["\n", "<eos>"]
EOS = len(VOCAB) - 1


# Defined here and sent by value: Ray's workers cannot import this test module.
def weights(prefix):
    time.sleep(0.005)  # concurrent requests overlap in time
    rng = np.random.default_rng(zlib.crc32(bytes(str(prefix[-3:]), "ascii")))
    w = rng.random(len(VOCAB)) ** 3
    w[EOS] = w[:EOS].sum() / 19
    return w


def toy_lm():
    return at.TableLM(VOCAB, weights, eos=EOS)


def chat_template(messages):
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def test_without_ray_serve_the_flag_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    assert main(["serve", "--replicas", "2", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--replicas needs Ray Serve: pip install 'adaptrack[replicas]'" in err


def test_the_router_keeps_a_prefix_on_its_replica_and_bounds_its_load():
    from adaptrack.serve.routing import PrefixRouter, routing_text

    r = PrefixRouter(["replica-0", "replica-1", "replica-2"], remembered=8)
    system = [{"role": "system", "content": "You are terse."}]
    turns = [[*system, {"role": "user", "content": f"question {i}"}] for i in range(5)]
    texts = [routing_text("chat", json.dumps({"messages": t}).encode()) for t in turns]
    first = r.route(texts[0])
    r.done(first)
    for text in texts[1:]:  # one after another: the shared system prompt keeps them
        assert r.route(text) == first
        r.done(first)
    # A later turn starts with the earlier one's text.
    later = [*turns[0], {"role": "assistant", "content": "ok"}]
    assert routing_text("chat", json.dumps({"messages": later}).encode()).startswith(texts[0])
    # 30 at once: no replica past ceil(1.25 x 30 / 3) = 13, and all three used.
    held = [r.route(texts[0]) for _ in range(30)]
    assert max(r.in_flight.values()) <= 13 and min(r.in_flight.values()) > 0
    for name in held:
        r.done(name)
    assert set(r.in_flight.values()) == {0}
    # Texts sharing nothing spread by their hash; the table forgets the oldest.
    spread = []
    for i in range(40):
        spread.append(r.route(f"{i}: unrelated".encode()))
        r.done(spread[-1])
    assert set(spread) == set(r.names) and len(r._sorted) == 8


def _front(replicas):
    """The front on a free loopback port in a thread: (its uvicorn server, thread, URL)."""
    from adaptrack.serve.front import create_front

    server = uvicorn.Server(uvicorn.Config(create_front(replicas), log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=None))
    sock = listen("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the front did not start"
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def replicas():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install "
                                            "'adaptrack[replicas]'")
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install "
                                            "'adaptrack[replicas]'")
    from adaptrack.serve.replicas import launch

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="warning")
    try:
        reps = launch(toy_lm, 2, {"model_name": "toy", "chat_template": chat_template},
                      actor_options={"num_cpus": 1})
        try:
            yield reps
        finally:
            reps.close()
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def url(replicas):
    server, thread, base = _front(replicas)
    yield base
    server.should_exit = True
    thread.join(30)


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def raw(url, method, path, body=None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def stats(response):
    return response.model_extra["adaptrack"]


def test_sixteen_concurrent_requests_are_all_answered_by_both_replicas(url):
    c = client(url)
    start = threading.Barrier(16)

    def ask(i):
        start.wait()
        # cd: 21 model calls of at least 5 ms each, so the 16 overlap.
        return c.completions.create(model="toy", prompt=f"A shared start, then request {i}",
                                    max_tokens=24, seed=i, extra_body={
                                        "guided_regex": "[a-z]{20}", "decoding_method": "cd"})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    assert all(re.fullmatch("[a-z]{20}", r.choices[0].text) for r in answers)
    served = [stats(r)["replica"] for r in answers]
    # 16 at once sharing a prefix: bounded loads spread them over both replicas.
    assert set(served) == NAMES, served


def test_requests_sharing_a_prefix_meet_the_replica_holding_their_tree(url):
    c = client(url)
    ask = dict(model="toy", prompt="Name three letters: ", max_tokens=6, seed=3,
               extra_body={"guided_regex": "[a-z]{3}", "decoding_method": "adaptrack"})
    first = c.completions.create(**ask)
    again = c.completions.create(**ask)
    assert stats(first)["replica"] == stats(again)["replica"] in NAMES
    # The same replica: the second request samples the first one's tree, asks the model
    # nothing new, and a seed gives the same text.
    assert stats(first)["trees_reused"] == 0 and stats(first)["lm_calls"] > 0
    assert stats(again)["trees_reused"] == 1 and stats(again)["lm_calls"] == 0
    assert again.choices[0].text == first.choices[0].text
    # A chat's next turn starts with its first turn: it goes where that turn went.
    system = {"role": "system", "content": "You answer with three lowercase letters."}
    turn = [system, {"role": "user", "content": "Pick a word."}]
    one = c.chat.completions.create(model="toy", messages=turn, max_tokens=6,
                                    extra_body={"guided_regex": "[a-z]{3}"})
    turn += [{"role": "assistant", "content": one.choices[0].message.content},
             {"role": "user", "content": "Another one."}]
    two = c.chat.completions.create(model="toy", messages=turn, max_tokens=6,
                                    extra_body={"guided_regex": "[a-z]{3}"})
    assert stats(one)["replica"] == stats(two)["replica"]


def test_a_streamed_answer_names_its_replica(url):
    status, headers, body = raw(url, "POST", "/v1/chat/completions", {
        "model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
        "stream": True, "stream_options": {"include_usage": True},
        "guided_regex": "[a-z]{3}"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in body.decode().splitlines()
              if line.startswith("data: {")]
    assert re.fullmatch("[a-z]{3}", "".join(e["choices"][0]["delta"].get("content") or ""
                                            for e in events if e["choices"]))
    assert events[-1]["adaptrack"]["replica"] == headers["x-adaptrack-replica"]
    assert headers["x-adaptrack-replica"] in NAMES


def test_health_models_and_metrics_cover_every_replica(url):
    status, _, body = raw(url, "GET", "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok"
    assert set(health["replicas"]) == NAMES
    assert all(h["status"] == "ok" for h in health["replicas"].values())
    assert [m.id for m in client(url).models.list().data] == ["toy"]
    before = answered(raw(url, "GET", "/metrics")[2].decode())
    for i in range(4):
        assert raw(url, "POST", "/v1/completions", {"prompt": f"{i}", "max_tokens": 2})[0] == 200
    text = raw(url, "GET", "/metrics")[2].decode()
    for name in NAMES:
        assert f'adaptrack_queue_length{{replica="{name}"}} 0' in text
    assert text.count("# TYPE adaptrack_requests_total counter") == 1
    # Each completion counted once, by the replica that answered it.
    assert answered(text) == before + 4


def answered(metrics):
    """Completions answered with 200, summed over the replicas."""
    return sum(int(n) for n in re.findall(r'adaptrack_requests_total\{replica="replica-\d",'
                                          r'endpoint="/v1/completions",status="200"\} (\d+)',
                                          metrics))


def test_a_client_that_leaves_has_its_walks_cancelled_on_its_replica(url):
    def total(name, text):
        return sum(int(n) for n in re.findall(rf'adaptrack_{name}\{{replica="replica-\d"\}} (\d+)',
                                              text))

    for stream in (False, True):
        before = total("cancelled_total", raw(url, "GET", "/metrics")[2].decode())
        sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        body = json.dumps({"prompt": "bye", "max_tokens": 2000, "stream": stream,
                           "guided_regex": "[a-z]{1990}", "decoding_method": "cd"})
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                     f"{body}".encode())
        deadline = time.monotonic() + 20
        while total("requests_running", raw(url, "GET", "/metrics")[2].decode()) == 0:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.01)
        sock.close()  # 1 990 tokens at 5 ms a call: ten seconds left, however slow /metrics is
        deadline = time.monotonic() + 20
        while total("cancelled_total", text := raw(url, "GET", "/metrics")[2].decode()) == before:
            assert time.monotonic() < deadline, f"not cancelled (stream: {stream}):\n{text}"
            time.sleep(0.01)


def test_a_stopping_front_finishes_the_requests_in_flight(replicas):
    server, thread, base = _front(replicas)
    stream = client(base).completions.create(
        model="toy", prompt="long:", max_tokens=40, seed=0, stream=True,
        extra_body={"guided_regex": "[a-z]{30}", "decoding_method": "cd"})
    pieces = [next(iter(stream)).choices[0].text]  # the request is in flight
    server.should_exit = True  # what SIGTERM does: no new connection, finish these
    pieces += [ch.choices[0].text for ch in stream if ch.choices]
    thread.join(60)
    assert not thread.is_alive()
    assert re.fullmatch("[a-z]{30}", "".join(pieces))
    with pytest.raises(OSError):
        raw(base, "GET", "/health")
