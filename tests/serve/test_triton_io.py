"""Request parsing, stop strings and response tensors (pure functions; no server)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmkiln.runtime.request import BadRequestParams, SamplingParams
from llmkiln.serve.triton_io import (
    InvalidRequest,
    RequestLimits,
    StopMatcher,
    parse_request,
    response_arrays,
)


def getter(**inputs):
    def get(name):
        v = inputs.get(name)
        return None if v is None else np.asarray(v)

    return get


def text(s: str) -> np.ndarray:
    return np.array([[s.encode()]], dtype=np.object_)


def test_minimal_request_has_trtllm_defaults():
    r = parse_request(getter(text_input=text("héllo"), max_tokens=np.array([[7]], dtype=np.int32)))
    assert (r.prompt, r.max_tokens, r.stream, r.exclude_input_in_output) == ("héllo", 7, False, False)
    assert r.sampling_kwargs() == {
        "max_tokens": 7,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
    }


def test_all_optional_inputs():
    r = parse_request(
        getter(
            text_input=np.array([b"hi"], dtype=np.object_),  # no batch dimension is accepted too
            max_tokens=np.array([3], dtype=np.int32),
            stream=np.array([[True]]),
            exclude_input_in_output=np.array([[True]]),
            temperature=np.array([[0.7]], dtype=np.float32),
            top_p=np.array([[0.9]], dtype=np.float32),
            top_k=np.array([[5]], dtype=np.int32),
            random_seed=np.array([[2**63]], dtype=np.uint64),
            end_id=np.array([[2]], dtype=np.int32),
            stop_words=np.array([[b"\n", b"", b"The end"]], dtype=np.object_),
            priority=np.array([[3]], dtype=np.int32),
            return_perf_metrics=np.array([[True]]),
        ),
        exclude_input_default=False,
    )
    assert r.stream and r.exclude_input_in_output and r.return_perf_metrics
    assert r.seed == 2**63 and r.priority == 3 and r.top_k == 5
    assert r.stop_words == ("\n", "The end")
    kw = r.sampling_kwargs()
    assert kw["stop_token_ids"] == (2,) and kw["temperature"] == pytest.approx(0.7)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"max_tokens": np.array([[3]], dtype=np.int32)}, "'text_input' is missing"),
        ({"text_input": text("x")}, "'max_tokens' is missing"),
        ({"text_input": text(""), "max_tokens": np.array([[3]])}, "'text_input' is empty"),
        ({"text_input": text("x"), "max_tokens": np.array([[1.5]])}, "expected an integer"),
        (
            {"text_input": np.array([[b"\xff\xfe"]], dtype=np.object_), "max_tokens": np.array([[3]])},
            "not valid UTF-8",
        ),
        (
            {"text_input": np.array([[b"a"], [b"b"]], dtype=np.object_), "max_tokens": np.array([[3]])},
            "batch size 1",
        ),
        (
            {"text_input": np.array([[b"a", b"b"]], dtype=np.object_), "max_tokens": np.array([[3]])},
            "one value",
        ),
        ({"text_input": text("x"), "max_tokens": np.array([[3]]), "top_p": np.array([[np.nan]])}, "finite"),
        (
            {"text_input": text("x"), "max_tokens": np.array([[3]]), "stream": np.array([[1]])},
            "expected BOOL",
        ),
    ],
)
def test_bad_requests_name_the_input(inputs, message):
    with pytest.raises(
        InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        parse_request(getter(**inputs))


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"max_tokens": np.array([[0]])}, "max_tokens must be an integer >= 1"),
        ({"top_p": np.array([[0.0]])}, "top_p must be in (0, 1]"),
        ({"temperature": np.array([[-1.0]])}, "temperature must be a number in [0, 100]"),
        ({"top_k": np.array([[-2]])}, "top_k must be an integer >= 0"),
    ],
)
def test_value_ranges_are_checked_once_by_the_runtime(extra, message):
    """The wire format checks types; the one validator of ranges is the runtime's SamplingParams."""
    req = parse_request(getter(**{"text_input": text("x"), "max_tokens": np.array([[3]]), **extra}))
    with pytest.raises(BadRequestParams) as exc:
        SamplingParams(**req.sampling_kwargs())
    assert message in str(exc.value)


def test_stop_matcher_cuts_and_holds_back_partial_matches():
    m = StopMatcher(("END",))
    assert m.feed("abc E") == ("abc ", False)  # "E" might start "END": held
    assert m.feed("N") == ("", False)
    assert m.feed("Dxyz") == ("", True)


def test_stop_matcher_releases_a_false_alarm():
    m = StopMatcher(("END",))
    assert m.feed("xE") == ("x", False)
    assert m.feed("x") == ("Ex", False)
    assert m.feed("E") == ("", False)
    assert m.finish() == "E"


@given(st.lists(st.text(alphabet="abcE ND", max_size=6), max_size=12))
def test_stop_matcher_output_is_the_text_before_the_first_stop(chunks):
    m = StopMatcher(("END", "cc"))
    out, stopped = [], False
    for c in chunks:
        piece, stopped = m.feed(c)
        out.append(piece)
        if stopped:
            break
    if not stopped:
        out.append(m.finish())
    full = "".join(chunks)
    cuts = [i for i in (full.find("END"), full.find("cc")) if i >= 0]
    assert "".join(out) == (full[: min(cuts)] if cuts else full)
    assert stopped == bool(cuts)


def test_response_tensors():
    out = response_arrays("é")
    assert list(out) == ["text_output"]
    assert out["text_output"].shape == (1, 1) and out["text_output"][0, 0] == "é".encode()


def test_size_limits_are_checked_before_decoding():
    limits = RequestLimits(max_prompt_bytes=8, max_stop_words=2, max_stop_word_bytes=3)
    ok = {"text_input": text("12345678"), "max_tokens": np.array([[3]])}
    assert parse_request(getter(**ok), limits=limits).prompt == "12345678"
    # not UTF-8 and too long: the size is what is reported (nothing was decoded)
    big = {"text_input": np.array([[b"\xff" * 9]], dtype=np.object_), "max_tokens": np.array([[3]])}
    with pytest.raises(InvalidRequest, match=r"9 bytes is more than serve.max_prompt_bytes \(8 bytes\)"):
        parse_request(getter(**big), limits=limits)
    many = {**ok, "stop_words": np.array([[b"a", b"b", b"c"]], dtype=np.object_)}
    with pytest.raises(InvalidRequest, match=r"3 stop strings is more than serve.max_stop_words \(2\)"):
        parse_request(getter(**many), limits=limits)
    long = {**ok, "stop_words": np.array([[b"abcd"]], dtype=np.object_)}
    with pytest.raises(InvalidRequest, match="serve.max_stop_word_bytes"):
        parse_request(getter(**long), limits=limits)


@pytest.mark.parametrize(
    "extra",
    [
        {"max_tokens": np.array([[2**40 + 5]], dtype=np.int64)},  # would wrap to 5 as INT32
        {"random_seed": np.array([[-7]], dtype=np.int64)},
        {"text_input": np.array([[b"secret\xff"]], dtype=np.object_)},
        {"temperature": np.array([[np.inf]])},
    ],
)
def test_errors_never_echo_the_raw_value(extra):
    inputs = {"text_input": text("x"), "max_tokens": np.array([[3]]), **extra}
    with pytest.raises(InvalidRequest) as exc:
        parse_request(getter(**inputs))
    msg = str(exc.value)
    for leaked in ("1099511627781", "-7", "secret", "\\xff", "inf"):
        assert leaked not in msg, msg


@pytest.mark.parametrize("field", ["max_tokens", "top_p", "temperature", "top_k", "seed"])
def test_sampling_errors_never_echo_the_value(field):
    bad = {
        "max_tokens": -123456,
        "top_p": 123456.0,
        "temperature": -123456.0,
        "top_k": -123456,
        "seed": -123456,
    }
    with pytest.raises(BadRequestParams) as exc:
        SamplingParams(**{field: bad[field]})
    assert "123456" not in str(exc.value) and field in str(exc.value)


def test_a_request_sets_its_speculative_tokens():
    r = parse_request(
        getter(
            text_input=text("hi"),
            max_tokens=np.array([[4]], dtype=np.int32),
            num_speculative_tokens=np.array([[0]], dtype=np.int32),
        )
    )
    assert r.sampling_kwargs()["num_speculative_tokens"] == 0


def test_a_hand_off_arrives_as_text_and_leaves_as_json():
    mt = np.array([[4]], dtype=np.int32)
    r = parse_request(
        getter(text_input=text("hi"), max_tokens=mt, disaggregated_params=text('{"kind": "x"}'))
    )
    assert r.disaggregated_params == '{"kind": "x"}'
    assert parse_request(getter(text_input=text("hi"), max_tokens=mt)).disaggregated_params is None
    with pytest.raises(InvalidRequest, match="input 'disaggregated_params': .* bytes is more than"):
        parse_request(
            getter(text_input=text("hi"), max_tokens=mt, disaggregated_params=text("x" * (2 << 20)))
        )
    out = response_arrays("", disaggregated_params={"kind": "llmkiln.local/1", "limit": 8})
    assert out["disaggregated_params"].reshape(-1)[0] == b'{"kind":"llmkiln.local/1","limit":8}'
    assert "disaggregated_params" not in response_arrays("a")
