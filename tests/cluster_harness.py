"""cluster_harness.py - N kipp-serve replicas on loopback behind vllm-router
for tests/test_cluster_router.py and tools/cluster_bench.py.

vllm-router is the PyPI package of the vLLM project's Rust load balancer (a
fork of sglang-router): `vllm-router --worker-urls ... --policy P`. It is used
rather than sglang-router because it is built for workers that speak vLLM's
OpenAI API and metrics, which is what kipp-serve exposes, and its kv_aware
policy consumes vLLM's KV events (kipp-serve --kv-events). Both routers
re-serialise request bodies with their own extension fields at their defaults
(no_stop_trim, skip_special_tokens, ...), which kipp-serve accepts at those
values only.

Every process here is started and stopped by this module, by its own pid;
every wait is bounded by a deadline.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from serve_harness import Server

REPO = Path(__file__).resolve().parent.parent


def router_bin() -> str:
    """The vllm-router launcher of the project's venv (tools/install_deps.sh installs it)."""
    venv = REPO / ".venv" / "bin" / "vllm-router"
    if venv.exists():
        return str(venv)
    found = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    if not Path(found).exists():
        raise RuntimeError("vllm-router is not installed: run tools/install_deps.sh (PyPI package vllm-router)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(port: int, method: str, path: str, body: dict | None = None, timeout: float = 600) -> tuple[int, dict | str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read().decode("utf-8", "replace")
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data
    finally:
        c.close()


def core_sets(n: int) -> list[list[int]]:
    """The CPUs this process may use, split into n disjoint runs (empty lists
    when there are fewer CPUs than replicas)."""
    cpus = sorted(os.sched_getaffinity(0))
    k = len(cpus) // n
    return [cpus[i * k:(i + 1) * k] for i in range(n)] if k else [[] for _ in range(n)]


class Replicas:
    """N kipp-serve processes (serve_harness.Server), each on its own free port.
    With pin=True each runs under taskset on its own share of the CPUs, so the
    replicas' pinned workers do not pile onto the same cores (the cpu
    backend pins inside the affinity it starts with)."""

    def __init__(self, model: Path, n: int, *args: str, pin: bool = False):
        self.servers = [Server(model, *args) for _ in range(n)]
        self.cores = core_sets(n) if pin else [[] for _ in range(n)]
        for s, cores in zip(self.servers, self.cores):
            if cores:
                s.cmd = ["taskset", "-c", ",".join(map(str, cores)), *s.cmd]

    def __enter__(self) -> "Replicas":
        try:
            for s in self.servers:
                s.__enter__()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.__exit__()
            elif s.proc is not None:  # killed by a fault run: just reap it
                s.proc.wait()
                s.proc.stdout.close(), s.proc.stderr.close()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{s.port}" for s in self.servers]

    def kill(self, i: int) -> None:
        """SIGKILL replica i: a crash, not a drain."""
        self.servers[i].proc.send_signal(signal.SIGKILL)

    def pool_figures(self) -> list[dict]:
        """Each live replica's prompt and pool counters from /metrics."""
        out = []
        for s in self.servers:
            row = {"url": f"http://127.0.0.1:{s.port}", "alive": s.proc.poll() is None}
            if row["alive"]:
                text = s.metrics()
                for key, name in (("prompt_tokens", "kipp_prompt_tokens_total"),
                                  ("cached_tokens", "kipp_prompt_tokens_cached_total"),
                                  ("pool_block_hits", "kipp_kv_pool_hits_total"),
                                  ("pool_block_misses", "kipp_kv_pool_misses_total"),
                                  ("pool_evictions", "kipp_kv_pool_evictions_total")):
                    m = re.search(rf"^{name} (\S+)$", text, re.M)
                    row[key] = float(m.group(1)) if m else None
                reqs = re.findall(r'^kipp_requests_total\{[^}]*status="2xx"[^}]*\} (\S+)$', text, re.M)
                row["requests_ok"] = sum(float(x) for x in reqs)
                p, c = row.get("prompt_tokens"), row.get("cached_tokens")
                row["hit_rate"] = c / p if p else None
            out.append(row)
        return out


class Router:
    """vllm-router in front of urls with one policy; use as a context manager."""

    def __init__(self, urls: list[str], policy: str, *extra: str):
        self.port, self.prom = free_port(), free_port()
        # Health checks every second and one failure to drop a worker, so a
        # killed replica leaves the rotation quickly; retries send a request
        # that could not reach its worker to another one.
        self.cmd = [router_bin(), "--worker-urls", *urls, "--policy", policy, "--host", "127.0.0.1",
                    "--port", str(self.port), "--prometheus-port", str(self.prom), "--log-level", "warning",
                    "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                    "--worker-startup-timeout-secs", "60", *extra]
        self.proc = None
        self.log = b""

    def __enter__(self) -> "Router":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        end = time.time() + 60
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited {self.proc.returncode}: {self.proc.stdout.read()[-3000:]!r}")
            try:
                st, _ = http_json(self.port, "GET", "/v1/models", timeout=2)
                if st == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("vllm-router did not answer /v1/models within 60 s")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log = self.proc.stdout.read()
            self.proc.stdout.close()


def stream_completion(port: int, body: dict, timeout: float = 600) -> dict:
    """One streamed /v1/completions request through port. Returns what the client
    saw: status, text, finish reason, usage, ttft (s), whether [DONE] came, error."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    out = {"status": None, "text": "", "finish": None, "usage": None, "ttft": None, "done": False, "error": None}
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out["status"] = r.status
        if r.status != 200:
            out["error"] = r.read()[:300].decode("utf-8", "replace")
            return out
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if line == b"data: [DONE]":
                out["done"] = True
                continue
            if not line.startswith(b"data: "):
                continue
            ch = json.loads(line[6:])
            if "error" in ch:
                out["error"] = str(ch["error"])[:300]
                continue
            if ch.get("usage"):
                out["usage"] = ch["usage"]
            for x in ch.get("choices") or []:
                if x.get("text"):
                    if out["ttft"] is None:
                        out["ttft"] = time.perf_counter() - t0
                    out["text"] += x["text"]
                if x.get("finish_reason"):
                    out["finish"] = x["finish_reason"]
        c.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["wall"] = time.perf_counter() - t0
    return out


def tenant_prompt(tenant: int, user: int, prefix_words: int = 300) -> str:
    """A shared-prefix multi-tenant prompt: tenant's long system text, then one user's question."""
    system = f"Tenant {tenant} system instructions. " + " ".join(f"rule{tenant}_{k}" for k in range(prefix_words))
    return f"{system}\nUser {user} asks: what is item {user * 7 + tenant}?\nAnswer:"


def env_threads(n_replicas: int) -> int:
    """Backend threads per replica: its share of the CPUs (core_sets)."""
    return max(1, len(core_sets(n_replicas)[0]))
