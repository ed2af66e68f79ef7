"""`specllama serve`'s HTTP API under a bounded fuzzing run (bench/fuzz.py): a real server
on 127.0.0.1 with the tiny models; hypothesis draws well-formed chat and plain
completions (tools, earlier tool calls, response_format, streams read to their end),
near-well-formed ones (a wrong type, a number out of range or of 5,000 digits, NaN, deep
nesting, a field taken out) and garbage, with a fixed seed and no example database.

Every answer must keep the API's promises: no 5xx but the documented 503s with
Retry-After, every error in OpenAI's shape, every stream ending with [DONE] or an error
event, output under a JSON response_format beginning as JSON, no traceback in the
server's log; and after the run a plain request and a stream still get 200 and /health
says ok. A failure is reported shrunk to a minimal request, one per kind. A longer run:
`python -m bench.fuzz --examples 2000` (bench/fuzz.py says more).
"""

from __future__ import annotations

import json

import pytest
from servers import ServerProcess

from bench import fuzz

# About 25 s of requests on 2 cores when nothing fails (shrinking a failure adds more).
EXAMPLES = 400
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 2048, "--draft-max", 3, "--temperature", 0.8,
                       "--max-tokens", MAX_TOKENS], tmp_path_factory.mktemp("fuzz"))
    yield s
    s.kill()


def test_the_http_api_keeps_its_promises_under_fuzzing(server):
    target = fuzz.Target(server.url, server.model, log=server.lines, timeout=60)
    try:
        report = fuzz.fuzz(target, EXAMPLES, seed=0, max_tokens=MAX_TOKENS)
        fuzz.after_run(target, report)
    finally:
        target.close()
    report.tracebacks = fuzz.tracebacks(server.lines)
    summary = "\n".join(report.lines())
    print(summary)
    assert server.proc.poll() is None, f"the server exited:\n{server.stderr[-3000:]}"
    assert not report.failed, summary

    # The run reached what it must cover, answered (not only refused).
    assert report.requests >= EXAMPLES * 0.9  # (hypothesis may draw a few it throws away)
    kinds = {kind for kind, _ in report.statuses}
    assert {"chat", "chat stream", "completion", "completion stream", "near chat",
            "near completion", "garbage", "other"} <= kinds, summary
    served = report.served
    for feature in ("chat/completions", "completions", "stream", "tools", "tool_choice",
                    "earlier tool calls", "response_format json_object",
                    "response_format json_schema"):
        assert served[feature] > 0, f"no 200 for a request with {feature}\n{summary}"
    assert {status for _, status in report.statuses} >= {"200", "400", "404", "422"}


# ------------------------------------------------ the fuzzer's own judgement, no server

CHAT = "/v1/chat/completions"
ERROR = '{"error": {"message": "m", "type": "invalid_request_error", "param": null, "code": null}}'


def post(body: dict, path: str = CHAT) -> fuzz.FuzzRequest:
    return fuzz.FuzzRequest("POST", path, fuzz.encode(body))


def signatures(req, **outcome) -> list[str]:
    return [p.signature for p in fuzz.check(req, fuzz.Outcome(**outcome))]


def test_bodies_hold_what_json_dumps_cannot_write():
    body = fuzz.encode({"a": fuzz.Raw("1" * 5000), "b": [fuzz.Raw("[" * 3 + "]" * 3)],
                        "c": "é\x00"})
    assert body == ('{"a": ' + "1" * 5000 + ', "b": [[[[]]]], "c": "é\\u0000"}').encode()
    assert "«'1' × 5000»" in repr(fuzz.FuzzRequest("POST", CHAT, body))


def test_what_counts_as_a_broken_promise():
    req = post({"model": "m"})
    assert signatures(req, status=400, text=ERROR) == []
    assert signatures(req, status=422, text='{"detail": "x"}') == \
        [f"422 on POST {CHAT}: not OpenAI's error shape"]
    assert signatures(req, status=400, text=ERROR.replace('"param": null, ', '')) != []
    # a 500 is named by the exception the server answered or logged
    assert signatures(req, status=500, text=ERROR.replace('"m"', '"internal server error"'),
                      log=["internal error on POST: RecursionError: deep"]) == \
        [f"500 on POST {CHAT}: RecursionError"]
    # a documented 503: with Retry-After and its code
    busy = ERROR.replace('"code": null', '"code": "queue_full"')
    assert signatures(req, status=503, text=busy, headers={"retry-after": "2"}) == []
    assert signatures(req, status=503, text=busy) != []
    assert signatures(fuzz.FuzzRequest("GET", "/health"), error="ReadTimeout: timed out") == \
        ["no answer to GET /health: ReadTimeout"]


def test_a_stream_ends_with_done_or_an_error_and_no_server_error():
    req = post({"model": "m", "stream": True})
    chunk = '{"object": "chat.completion.chunk", "choices": []}'
    assert signatures(req, status=200, events=[chunk, "[DONE]"]) == []
    assert signatures(req, status=200, events=[chunk, ERROR, "[DONE]"]) == []
    assert signatures(req, status=200, events=[chunk, ERROR]) == []
    assert signatures(req, status=200, events=[chunk]) == [f"stream on POST {CHAT} without [DONE]"]
    failed = ERROR.replace("invalid_request_error", "server_error").replace(
        '"m"', '"generation failed: IndexError: x"')
    assert signatures(req, status=200, events=[chunk, failed, "[DONE]"]) == \
        [f"stream on POST {CHAT}: server_error event: IndexError"]
    assert signatures(req, status=200, events=[ERROR, chunk, "[DONE]"]) == \
        [f"stream on POST {CHAT}: events after an error"]
    assert signatures(req, status=200, events=[chunk], error="RemoteProtocolError: cut") == \
        [f"stream cut on POST {CHAT}: RemoteProtocolError"]


def test_output_under_a_json_response_format_that_stopped_is_json():
    req = post({"model": "m", "response_format": {"type": "json_object"}})

    def answer(content, finish="stop"):
        return json.dumps({"object": "chat.completion", "choices": [
            {"message": {"content": content}, "finish_reason": finish}]})

    assert signatures(req, status=200, text=answer('{"a": 1}')) == []
    assert signatures(req, status=200, text=answer('{"a"', finish="length")) == []
    assert signatures(req, status=200, text=answer("Sure!")) == \
        [f"200 on POST {CHAT}: response_format json_object not followed"]
    # cut at max_tokens, it still begins as the format says
    assert signatures(req, status=200, text=answer("<tool_call>", finish="length")) == \
        [f"200 on POST {CHAT}: response_format json_object not followed"]
    assert signatures(req, status=200, text=answer(" [1", finish="length")) != []
    schema = post({"model": "m", "response_format": {"type": "json_schema"}})
    assert signatures(schema, status=200, text=answer(' "a', finish="length")) == []
    assert signatures(schema, status=200, text=answer("null")) == []
