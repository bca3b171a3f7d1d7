"""test_serve_json.py - response_format through kipp-serve with the official
`openai` client: json_object and json_schema replies always parse with
json.loads and validate with `jsonschema` (the independent oracle), for every
supported schema keyword, several seeds and temperatures, streamed and not,
thinking off and on (the schema binds only the text after </think>); the
openai client's own .parse() with a pydantic model; and the 400s for what is
not supported. The synthetic weights make random but valid JSON, which is
exactly the test: finish_reason must be "stop", never a truncation.
"""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

N_CTX = 2048
THINK, THINK_END = 151667, 151668  # <think>, </think>
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
CLOSERS = {"1": 60, "92": 30, "60": 30}  # '"', '}', ']' (byte-level ids: ord(c) - 33)

SCHEMA_ALL = {
    "title": "Everything", "description": "every supported keyword", "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10, "description": "a name"},
        "age": {"type": "integer"},
        "score": {"type": "number", "default": 1.5},
        "ok": {"type": "boolean"},
        "nothing": {"type": "null"},
        "color": {"enum": ["red", "green", "blue"]},
        "kind": {"const": "k"},
        "mixed": {"enum": [1, "two", None, [3], {"four": 4}]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3},
        "maybe": {"type": ["string", "null"], "maxLength": 4},
        "nested": {"type": "object", "properties": {
            "x": {"type": "integer"},
            "y": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]}},
            "required": ["x"], "additionalProperties": False},
        "point": {"$ref": "#/$defs/Point"},
        "free": {"type": "object", "properties": {"v": {"type": "boolean"}}},
    },
    "required": ["name", "age", "score", "ok", "nothing", "color", "kind", "mixed", "tags", "nested", "point"],
    "additionalProperties": False,
    "$defs": {"Point": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"], "additionalProperties": False}},
}

SCHEMA_TOOLISH = {  # the shape of tool parameters, with definitions
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "unit": {"anyOf": [{"$ref": "#/definitions/Unit"}, {"type": "null"}]},
                   "days": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}},
    "required": ["city", "unit", "days"],
    "definitions": {"Unit": {"type": "string", "enum": ["c", "f"]}},
}


def rf_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def ask(client, rf, seed, temperature, stream, extra=None, max_tokens=1500, n=1, **more):
    kw = dict(**more,model="synthetic-tiny", messages=[{"role": "user", "content": "Give me JSON."}], response_format=rf,
              seed=seed, temperature=temperature, max_tokens=max_tokens, n=n, extra_body=extra or NO_THINK)
    if not stream:
        r = client.chat.completions.create(**kw)
        return [(c.message.content, c.finish_reason, (c.message.model_extra or {}).get("reasoning_content"))
                for c in sorted(r.choices, key=lambda c: c.index)]
    out = {}
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            o = out.setdefault(c.index, ["", None, ""])
            o[0] += c.delta.content or ""
            o[2] += (c.delta.model_extra or {}).get("reasoning_content") or ""
            o[1] = c.finish_reason or o[1]
    return [tuple(out[i]) for i in sorted(out)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("seed,temperature", [(1, 0.7), (2, 1.0), (3, 1.3)])
def test_json_object(client, seed, temperature, stream):
    # free-form strings have no length cap, and these weights repeat a token forever: favour the closing bytes
    extra = dict(NO_THINK, logit_bias=CLOSERS)
    for content, finish, _ in ask(client, {"type": "json_object"}, seed, temperature, stream, extra=extra,
                                  frequency_penalty=1.0):
        assert finish == "stop", content
        assert isinstance(json.loads(content), dict), content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("schema", [SCHEMA_ALL, SCHEMA_TOOLISH], ids=["all_keywords", "toolish"])
@pytest.mark.parametrize("seed,temperature", [(4, 0.0), (5, 0.8), (6, 1.2)])
def test_json_schema_validates(client, schema, seed, temperature, stream):
    for content, finish, _ in ask(client, rf_schema(schema), seed, temperature, stream, n=2):
        assert finish == "stop", content
        doc = json.loads(content)
        jsonschema.validate(doc, schema)
        assert list(doc)[:3] == [k for k in schema["properties"] if k in doc][:3], "declared order"


def test_stream_equals_nonstream(client):
    a = ask(client, rf_schema(SCHEMA_TOOLISH), 9, 1.0, False)
    b = ask(client, rf_schema(SCHEMA_TOOLISH), 9, 1.0, True)
    assert [x[:2] for x in a] == [x[:2] for x in b]


def test_text_is_a_no_op(client):
    a = ask(client, {"type": "text"}, 3, 0.9, False, max_tokens=20)
    b = ask(client, None, 3, 0.9, False, max_tokens=20)
    assert a == b


def test_thinking_on(client):
    """Thinking on: the reasoning is free text; the schema binds the content after </think> (<think> then
    </think> forced by a logit_bias on the markers, which the grammar masks afterwards). A reply that does
    not open with <think> is constrained from its first token."""
    rf = rf_schema(SCHEMA_TOOLISH)
    both = {"logit_bias": {str(THINK): 100, str(THINK_END): 100}}
    for stream in (False, True):
        [(content, finish, reasoning)] = ask(client, rf, 11, 1.0, stream, extra=both, presence_penalty=2.0)
        assert finish == "stop", content
        jsonschema.validate(json.loads(content), SCHEMA_TOOLISH)
        assert reasoning.startswith("<think>"), reasoning  # free text: the grammar would have refused it
    # reasoning that never closes: no content at all (null, as vLLM sends it), and the reasoning is not held to the schema
    [(content, finish, reasoning)] = ask(client, rf, 12, 1.0, False, extra={"logit_bias": {str(THINK): 100}},
                                         max_tokens=8)
    assert finish == "length" and content is None and reasoning == "<think>" * 7, reasoning
    [(content, finish, reasoning)] = ask(client, rf, 13, 1.0, False, extra={})
    assert finish == "stop" and not reasoning, (content, reasoning)
    jsonschema.validate(json.loads(content), SCHEMA_TOOLISH)


def test_openai_parse_pydantic(client):
    pydantic = pytest.importorskip("pydantic")
    from typing import List, Literal, Optional

    class Item(pydantic.BaseModel):
        label: str = pydantic.Field(max_length=6)
        qty: int

    class Order(pydantic.BaseModel):
        customer: str = pydantic.Field(max_length=8)
        items: List[Item] = pydantic.Field(max_length=2)
        rush: bool
        note: Optional[Literal["gift", "fragile"]]

    for seed in (1, 2):
        r = client.beta.chat.completions.parse(
            model="synthetic-tiny", messages=[{"role": "user", "content": "order"}], response_format=Order, seed=seed,
            temperature=1.0, max_tokens=1500, extra_body=NO_THINK)
        c = r.choices[0]
        assert c.finish_reason == "stop"
        assert isinstance(c.message.parsed, Order), c.message.content


@pytest.mark.parametrize("rf,needle", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}, "pattern"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"d": {"format": "date"}}}}},
     "#/properties/d"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 0}}}, "minimum"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"oneOf": [{"type": "string"}]}}}, "oneOf"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "https://x/y"}}}, "$ref"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}, "extra"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "xml"}, "xml"),
    ({"type": "json_object", "schema": {}}, "schema"),
    ("json", "object"),
])
def test_refused(srv, rf, needle):
    st, body = srv.post("/v1/chat/completions", {"model": "synthetic-tiny", "response_format": rf, "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "x"}]})
    assert st == 400, body
    err = body["error"]
    assert err["param"] == "response_format" and needle in err["message"], err


def test_completions_endpoint(srv):
    st, body = srv.post("/v1/completions", {"model": "synthetic-tiny", "prompt": "JSON:", "max_tokens": 1500,
                                            "seed": 5, "temperature": 1.0,
                                            "response_format": rf_schema(SCHEMA_TOOLISH)})
    assert st == 200, body
    c = body["choices"][0]
    assert c["finish_reason"] == "stop"
    jsonschema.validate(json.loads(c["text"]), SCHEMA_TOOLISH)
