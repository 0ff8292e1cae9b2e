"""Redaction: secret shapes are masked, long strings cut after masking, structure bounded."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_jupyter.core.redact import (
    LINE_MASK,
    MASK,
    looks_secret,
    mask_secret_lines,
    redact,
    redact_arguments,
)

SECRETS = [
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv",
    "sk-proj-1234567890abcdefABCDEF",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "github_pat_11ABCDEFG0123456789_abcdefghij",
    "AKIAIOSFODNN7EXAMPLE",
    "xoxb-1234567890-abcdefghij",
    "AIzaSyA1234567890abcdefghijklmnopqrstu",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTYifQ.SflKxwRJSMeKKF2QT4fwpM",
]


@pytest.mark.parametrize("secret", SECRETS)
def test_known_token_shapes_are_masked_inside_text(secret):
    text = f"use {secret} for this"
    assert looks_secret(text)
    assert secret not in json.dumps(redact({"note": text}))


@pytest.mark.parametrize("text", [
    "Authorization: Bearer x",
    "Bearer abc.def",
    "password=hunter2",
    "db_password: 'hunter 2'",
    "API_KEY=0123456789abcdef0123",
    "X-Auth-Token: deadbeefcafebabe",
    "https://bob:s3cret@example.com/repo.git",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA (truncated, no footer)",
])
def test_contextual_secrets(text):
    assert looks_secret(text)
    out = redact(text, max_str=10_000)
    for part in ("hunter", "0123456789abcdef0123", "deadbeefcafebabe", "s3cret", "b3BlbnNzaC1rZXktdjEA", "MIIEow"):
        assert part not in out


@pytest.mark.parametrize("text", ["hello world", "the author wrote 3 pages", "a = b + 1", "git sha 1f2e3d",
                                  "max_tokens is a count", "passage"])
def test_plain_text_is_left_alone(text):
    assert not looks_secret(text)
    assert redact(text) == text


def test_secret_keys_mask_whole_values_but_keep_counts():
    out = redact({"password": "x", "apiKey": 123456, "headers": {"Authorization": "anything at all"},
                  "max_tokens": 100, "input_tokens": 5, "author": "Ada", "token": None})
    assert out == {"password": MASK, "apiKey": MASK, "headers": {"Authorization": MASK},
                   "max_tokens": 100, "input_tokens": 5, "author": "Ada", "token": None}


def test_long_strings_are_cut_after_masking():
    secret = "sk-ant-" + "A" * 300
    out = redact({"a": "x" * 500, "b": secret}, max_str=50)
    assert out["a"].startswith("x" * 50) and out["a"].endswith("[+450 chars]")
    assert out["b"] == MASK  # masked whole, not cut into a leaking prefix


def test_structure_is_bounded_and_json_safe():
    cyc: list = []
    cyc.append(cyc)
    out = redact({"cyc": cyc, "b": b"\x00\x01", "t": (1, 2), "s": {3}, "o": object(), 5: "int key",
                  "many": list(range(500))}, max_items=10, max_depth=4)
    json.dumps(out)
    assert out["b"] == "<2 bytes>" and out["t"] == [1, 2] and out["s"] == [3]
    assert out["5"] == "int key"
    assert out["many"][-1] == "<490 more items>" and len(out["many"]) == 11
    assert "<nested too deep>" in json.dumps(out["cyc"])


def test_redact_returns_a_copy():
    src = {"a": [1, {"b": "c"}]}
    out = redact(src)
    out["a"][1]["b"] = "changed"
    assert src == {"a": [1, {"b": "c"}]}


def test_mask_secret_lines():
    lines = ["x = 1", "key = 'sk-ant-api03-abcdefghijkl'", "print(x)"]
    assert mask_secret_lines(lines) == ["x = 1", LINE_MASK, "print(x)"]


@pytest.mark.parametrize("bad", [{"max_str": 0}, {"max_str": -1}, {"max_items": 0}, {"max_depth": True},
                                 {"max_str": 2.5}])
def test_bad_limits(bad):
    with pytest.raises(ValueError):
        redact("x", **bad)


def test_looks_secret_needs_str():
    with pytest.raises(TypeError):
        looks_secret(b"sk-ant-xxxxxxxx")  # type: ignore[arg-type]


_tail = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=20, max_size=40)
secret_st = st.one_of(
    _tail.map(lambda t: "sk-ant-api03-" + t),
    _tail.map(lambda t: "sk-" + t),
    _tail.map(lambda t: "ghp_" + t),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16).map(lambda t: "AKIA" + t),
    _tail.map(lambda t: "Bearer " + t),
    _tail.map(lambda t: "password=" + t),
)
filler = st.text(alphabet=" \n\t,.;:!?()[]{}<>'\"#abcxyz", max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=secret_st, before=filler, after=filler, max_str=st.integers(1, 80))
def test_property_generated_secret_never_survives(secret, before, after, max_str):
    out = json.dumps(redact({"k": [before + secret + after]}, max_str=max_str))
    core = secret.split("=", 1)[-1].split(" ", 1)[-1]  # the credential part
    assert core not in out
    # and no long piece of it either (a cut must not leave a usable prefix)
    assert core[:16] not in out


def test_huge_strings_are_masked_in_a_window_and_cut():
    secret = "sk-ant-api03-" + "Q" * 40
    text = "a" * 95 + secret + "b" * 5_000_000 + "sk-ant-api03-" + "Z" * 40
    out = redact({"blob": text}, max_str=100)["blob"]
    assert "QQQQQQ" not in out and "ZZZZ" not in out
    assert out.endswith(f"…[+{len(text) - 100} chars]") and len(out) < 200


@pytest.mark.parametrize("start", [0, 50, 95, 99, 100, 101])
def test_secret_straddling_the_cut_leaves_no_prefix(start):
    for secret in ("ghp_" + "R" * 36, "AKIA" + "ABCDEFGHIJKLMNOP", "password=" + "hunter2hunter2"):
        text = "x" * start + secret + " tail" * 400
        out = redact(text, max_str=100)
        tail = secret[4:10] if not secret.startswith("password") else "hunter"
        assert tail not in out, (start, secret, out)


def test_huge_and_odd_keys():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

        def __hash__(self):
            return 1

    out = redact({"x" * 10_000 + "_password": "hunter2", ("t", 1): "v", Hostile(): Hostile()}, max_str=20)
    assert "hunter2" not in json.dumps(out)
    assert any(v == MASK for v in out.values())
    assert any(str(v).startswith("<Hostile (repr fail") for v in out.values())
    assert redact(Hostile(), max_str=100) == "<Hostile (repr failed: RuntimeError)>"


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=300),
                                     secret_st), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=20) | st.sampled_from(["password", "max_tokens"]),
                                             inner, max_size=4), max_leaves=12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.dictionaries(st.text(max_size=30) | st.sampled_from(["token", "api_key", "path"]), json_values,
                            max_size=6))
def test_property_redact_arguments_is_redact(args):
    """The gate's fast path gives exactly what redact() gives."""
    assert redact_arguments(args) == redact(args)
