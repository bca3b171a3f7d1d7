"""test_cluster_router.py - kipp-serve replicas behind vllm-router (issue 35,
item 5), sized for CI: two synthetic-tiny replicas, two tenants, a few
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
    with Replicas(model, 2, *ARGS) as reps, Router(reps.urls, "cache_aware") as router:
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
