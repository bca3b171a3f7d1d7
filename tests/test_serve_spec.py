"""test_serve_spec.py - kipp-serve's speculative decoding.

Greedy requests (temperature 0, or top_k 1) decode speculatively by default
and must return exactly what the same server returns with --no-spec: text,
finish reason, token counts and logprobs, for n = 1 and 3, streamed or not.
The ref backend is used because its verification rows equal its decode rows
bitwise (the cpu backend's do not yet: row invariance, see docs/PERFORMANCE.md). /metrics
shows the speculative counters; sampled requests leave them alone.
"""
from __future__ import annotations

import pytest

from serve_harness import Server

PROMPTS = ["The quick brown fox", "Once upon a time, once upon a time, once upon a", "def f(x):\n    return x"]


@pytest.fixture(scope="module")
def pair(synthetic_gguf):
    model = synthetic_gguf("synthetic-tiny")
    with Server(model, "--ctx", "128", backend="ref") as spec, \
         Server(model, "--ctx", "128", "--no-spec", backend="ref") as plain:
        yield spec, plain


def _complete(srv, **kw):
    st, r = srv.post("/v1/completions", {"max_tokens": 24, **kw})
    assert st == 200, r
    return r


def _strip(r: dict) -> list:
    return [(c["text"], c["finish_reason"], c.get("logprobs")) for c in r["choices"]]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("kw", [{"temperature": 0}, {"temperature": 0.9, "top_k": 1, "seed": 3},
                                {"temperature": 0, "n": 3, "logprobs": 2}])
def test_greedy_requests_equal_no_spec(pair, prompt, kw):
    spec, plain = pair
    a, b = _complete(spec, prompt=prompt, **kw), _complete(plain, prompt=prompt, **kw)
    assert _strip(a) == _strip(b)
    assert a["usage"] == b["usage"]


def test_spec_counters_in_metrics(pair):
    spec, plain = pair
    _complete(spec, prompt=PROMPTS[0], temperature=0, max_tokens=40)
    _complete(plain, prompt=PROMPTS[0], temperature=0, max_tokens=40)
    steps, drafted = spec.gauge("kipp_spec_steps_total"), spec.gauge("kipp_spec_drafted_tokens_total")
    accepted, emitted = spec.gauge("kipp_spec_accepted_tokens_total"), spec.gauge("kipp_spec_emitted_tokens_total")
    assert steps > 0 and 0 < accepted <= drafted and emitted >= steps
    assert emitted > steps, "the repetitive prompt should give more than one token per speculative step"
    assert plain.gauge("kipp_spec_steps_total") == 0


def test_sampled_requests_do_not_speculate(pair):
    spec, _ = pair
    before = spec.gauge("kipp_spec_steps_total")
    _complete(spec, prompt=PROMPTS[0], temperature=0.8, seed=1)
    assert spec.gauge("kipp_spec_steps_total") == before


def test_no_spec_in_help():
    import subprocess
    from serve_harness import SERVE
    r = subprocess.run([str(SERVE), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--no-spec" in r.stdout


# ---- --draft-model: a draft model (synthetic-tiny's affine4 twin) instead of prompt lookup ----

@pytest.fixture(scope="module")
def drafted(synthetic_gguf):
    """The affine4 twin with its quantized head: on the tiny shape the 151,936-row head is most of
    the bytes, so a twin with a BF16 head costs the gate about a whole target step per draft token,
    and it rightly never drafts (a paused draft model is first probed after 128 steps)."""
    model = synthetic_gguf("synthetic-tiny")
    twin = model.parent / "synthetic-tiny-affine4_gs32-head_affine4_gs32.gguf"
    assert twin.is_file(), f"{twin} is missing: `make models-test` writes it"
    with Server(model, "--ctx", "128", "--draft-model", str(twin), backend="ref") as srv:
        assert f"; draft model {twin}" in srv.banner, srv.banner  # the startup line names the draft
        yield srv


@pytest.mark.parametrize("kw", [{"temperature": 0}, {"temperature": 0, "n": 3, "logprobs": 2}])
def test_draft_model_greedy_equals_no_spec(pair, drafted, kw):
    _, plain = pair
    for prompt in PROMPTS[:2]:
        a, b = _complete(drafted, prompt=prompt, **kw), _complete(plain, prompt=prompt, **kw)
        assert _strip(a) == _strip(b)
        assert a["usage"] == b["usage"]
    assert drafted.gauge("kipp_spec_drafted_tokens_total") > 0


def test_draft_model_speculates_sampled_requests(drafted):
    before = drafted.gauge("kipp_spec_steps_total")
    r = _complete(drafted, prompt=PROMPTS[0], temperature=0.8, seed=1, max_tokens=16)
    assert r["usage"]["completion_tokens"] >= 1
    assert drafted.gauge("kipp_spec_steps_total") > before, "a sampled request verifies by speculative sampling"


def test_draft_model_missing_file_is_refused(synthetic_gguf, tmp_path):
    import subprocess
    from serve_harness import SERVE
    missing = tmp_path / "no-such-draft.gguf"
    r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf("synthetic-tiny")), "--draft-model", str(missing),
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(missing) in r.stderr and "synthetic-tiny.gguf" in r.stderr


@pytest.mark.parametrize("draft,kind", [("synthetic-tiny-embedding", "an embedding"), ("synthetic-tiny-reranker", "a reranker")])
def test_retrieval_model_is_refused_as_draft(synthetic_gguf, draft, kind):
    """A retrieval model never generates: as a draft it would only cost; refused at startup, named."""
    import subprocess
    from serve_harness import SERVE
    r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf("synthetic-tiny")), "--draft-model",
                        str(synthetic_gguf(draft)), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"the draft is {kind} model" in r.stderr and f"{draft}.gguf" in r.stderr, r.stderr


# ---- --draft-self, --draft-max, --draft-min: the model's own quantized twin as the draft ----

@pytest.fixture(scope="module")
def self_drafted(synthetic_gguf):
    model = synthetic_gguf("synthetic-tiny")
    twin = model.parent / "synthetic-tiny-q8_0-head_q8_0.gguf"  # the quantized-head twin comes first
    assert twin.is_file(), f"{twin} is missing: `make models-test` writes it"
    with Server(model, "--ctx", "128", "--draft-self", "q8_0", "--draft-max", "2", backend="ref") as srv:
        assert f"; draft model {twin}" in srv.banner, srv.banner
        yield srv


@pytest.mark.parametrize("kw", [{"temperature": 0}, {"temperature": 0, "n": 3, "logprobs": 2}])
def test_draft_self_greedy_equals_no_spec(pair, self_drafted, kw):
    _, plain = pair
    for prompt in PROMPTS[:2]:
        a, b = _complete(self_drafted, prompt=prompt, **kw), _complete(plain, prompt=prompt, **kw)
        assert _strip(a) == _strip(b)
        assert a["usage"] == b["usage"]
    # --draft-max 2: no verification checks more than 2 drafted tokens
    steps, drafted = self_drafted.gauge("kipp_spec_steps_total"), self_drafted.gauge("kipp_spec_drafted_tokens_total")
    assert steps > 0 and 0 < drafted <= 2 * steps


@pytest.mark.parametrize("model,args,needle", [
    ("synthetic-tiny", ["--draft-self", "q4"], "--draft-self 'q4' is invalid, expected q8_0 or affine4"),
    ("synthetic-tiny", ["--draft-self", "q8_0", "--no-spec"], "--draft-self and --no-spec: speculation is off"),
    ("synthetic-tiny", ["--draft-max", "2"], "--draft-max applies to a draft model, expected it with --draft-model or "
                                             "--draft-self"),
    ("synthetic-tiny", ["--draft-self", "q8_0", "--draft-max", "2", "--draft-min", "3"],
     "--draft-min 3 is above the longest draft 2"),
    ("synthetic-tiny", ["--draft-self", "q8_0", "--draft-model", "x.gguf"], "both name a draft"),
    ("synthetic-tiny", ["--draft-self", "q8_0", "--draft-max", "17"], "--draft-max '17' is invalid, expected an integer "
                                                                      "in 1..16"),
    ("synthetic-tiny-untied", ["--draft-self", "q8_0"], "synthetic-tiny-untied-q8_0.gguf' is next to the model"),
])
def test_draft_option_errors(synthetic_gguf, model, args, needle):
    import subprocess
    from serve_harness import SERVE
    r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf(model)), *args, "--port", "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
