"""test_cluster_router.py - kipp-serve replicas behind vllm-router,
sized for CI: two synthetic-tiny replicas, two tenants, a few
requests. `make bench-cluster` is the full-size run (tools/cluster_bench.py).

Oracles:
  - every answer through the router is the answer the same greedy request gets
    from a replica directly (all replicas hold the same model, so routing must
    not change a byte);
  - the replicas' own /metrics add up to what the clients saw (prompt and
    cached tokens), so the per-replica hit rate the benchmark reports is the
    clients' truth;
  - with cache-aware routing, a tenant's later requests land where its prefix
    is cached (cached_tokens > 0), and after a replica is killed every request
    still succeeds on the other.
"""
from __future__ import annotations

import time

from cluster_harness import Replicas, Router, http_json, stream_completion, tenant_prompt

ARGS = ("--ctx", "1024", "--kv-pool-mib", "16", "--threads", "1")


def _body(tenant: int, user: int) -> dict:
    return {"prompt": tenant_prompt(tenant, user, prefix_words=60), "max_tokens": 6, "temperature": 0}


def test_router_forwards_exactly_and_routes_by_prefix(synthetic_gguf):
    model = synthetic_gguf("synthetic-tiny")
    plan = [(t, u) for u in range(3) for t in range(2)]  # tenants interleaved, users in turn
    with Replicas(model, 1, *ARGS) as ref:
        want = {}
        for t, u in plan:
            st, body = http_json(ref.servers[0].port, "POST", "/v1/completions", _body(t, u))
            assert st == 200, body
            want[(t, u)] = body["choices"][0]["text"]
    with Replicas(model, 2, *ARGS, pin=True) as reps, Router(reps.urls, "cache_aware") as router:
        seen = {}
        for t, u in plan:
            r = stream_completion(router.port, _body(t, u))
            assert r["status"] == 200 and r["done"] and r["finish"] == "length" and not r["error"], r
            assert r["text"] == want[(t, u)], (t, u, r["text"], want[(t, u)])
            seen[(t, u)] = r["usage"]
        for t in range(2):
            for u in (1, 2):
                assert seen[(t, u)]["prompt_tokens_details"]["cached_tokens"] >= 32, \
                    f"tenant {t} user {u} was not routed to its cached prefix: {seen[(t, u)]}"
        figs = reps.pool_figures()
        assert sum(f["prompt_tokens"] for f in figs) == sum(v["prompt_tokens"] for v in seen.values())
        assert sum(f["cached_tokens"] for f in figs) == sum(v["prompt_tokens_details"]["cached_tokens"] for v in seen.values())
        assert sum(f["requests_ok"] for f in figs) == len(plan)

        # a replica crashes: once the router's health check has dropped it, every request succeeds on the other
        reps.kill(0)
        time.sleep(3)
        for u in range(3, 6):
            r = stream_completion(router.port, _body(u % 2, u))
            assert r["status"] == 200 and r["done"] and not r["error"], r
        alive = [f for f in reps.pool_figures() if f["alive"]]
        assert len(alive) == 1 and alive[0]["requests_ok"] >= 3


def test_router_extension_fields_only_at_kipps_behaviour(synthetic_gguf):
    """The fields vllm-router adds to forwarded bodies (seen on the wire: it
    re-serialises every request) are accepted at their defaults, which are what
    Kipp does, and refused by name at any other value."""
    comp = {"no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
    chat = {**comp, "continue_final_message": False, "separate_reasoning": True, "stream_reasoning": True,
            "include_reasoning": True}
    with Replicas(synthetic_gguf("synthetic-tiny"), 1, *ARGS) as reps:
        port = reps.servers[0].port
        plain = http_json(port, "POST", "/v1/completions", _body(0, 0))[1]
        st, got = http_json(port, "POST", "/v1/completions", {**_body(0, 0), **comp})
        assert st == 200 and got["choices"][0]["text"] == plain["choices"][0]["text"], got
        msgs = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        st, got = http_json(port, "POST", "/v1/chat/completions", {**msgs, **chat})
        assert st == 200, got
        for k, v in {**comp, "include_reasoning": True}.items():
            path = "/v1/chat/completions" if k == "include_reasoning" else "/v1/completions"
            base = msgs if k == "include_reasoning" else _body(0, 0)
            st, got = http_json(port, "POST", path, {**base, k: not v})
            assert st == 400 and got["error"]["param"] == k and f"expected {str(v).lower()}" in got["error"]["message"], got
        st, got = http_json(port, "POST", "/v1/completions", {**_body(0, 0), "include_reasoning": True})
        assert st == 400 and "not supported by /v1/completions" in got["error"]["message"], got


def _kv_aware_run(model, fmt: str, want: dict) -> str:
    """Two replicas publishing --kv-events in fmt behind vllm-router's kv_aware
    policy; every answer checked against want; returns the router's log."""
    from cluster_harness import free_port
    reps = Replicas(model, 2, *ARGS, pin=True)
    ports = [free_port() for _ in reps.servers]
    for s, p in zip(reps.servers, ports):
        s.cmd += ["--kv-events", f"tcp://*:{p}", "--kv-events-format", fmt]
    with reps:
        extra = [a for url, p in zip(reps.urls, ports) for a in ("--kv-event-source", f"{url}=tcp://127.0.0.1:{p}")]
        router = Router(reps.urls, "kv_aware", *extra, "--kv-event-block-size", "32", "--kv-event-model", "synthetic-tiny",
                        "--log-level", "info")
        with router:
            time.sleep(1)  # the router's subscribers connect
            for k, text in want.items():
                r = stream_completion(router.port, _body(*k))
                assert r["status"] == 200 and r["done"] and r["text"] == text, (k, r)
            time.sleep(1)
        assert sum(f["requests_ok"] for f in reps.pool_figures()) == len(want)
    return router.log.decode("utf-8", "replace")


def test_kv_aware_router_decodes_kipp_kv_events(synthetic_gguf):
    """vllm-router's kv_aware policy subscribes to each replica's KV events and
    logs every batch it cannot decode: with --kv-events-format map there must be
    none, and the array shape (which it does not take) shows that the check
    sees a failure."""
    model = synthetic_gguf("synthetic-tiny")
    plan = [(t, u) for u in range(2) for t in range(2)]
    with Replicas(model, 1, *ARGS) as ref:
        want = {k: http_json(ref.servers[0].port, "POST", "/v1/completions", _body(*k))[1]["choices"][0]["text"]
                for k in plan}
    log = _kv_aware_run(model, "map", want)
    assert log.count("kv_index subscriber for") == 2, log[-3000:]
    assert "decode batch" not in log, f"vllm-router could not decode kipp-serve's KV events: {log[-2000:]}"
    log = _kv_aware_run(model, "array", want)
    assert "decode batch" in log, "the array shape is expected to be refused by this router's decoder"
