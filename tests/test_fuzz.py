"""`specllama serve`'s HTTP API under a bounded fuzzing run (tests/fuzz/): a real server
on 127.0.0.1 with the tiny models; hypothesis draws well-formed requests of Chat
Completions, Completions, the Responses API (items, function calls and their outputs,
text.format, follow-ups on stored responses) and the Messages API (tool_use and
tool_result blocks, thinking, output_config.format, stop_sequences, count_tokens), streams
read to their end, near-well-formed ones (a wrong type, a number out of range or of 5,000
digits, NaN, deep nesting, a field taken out, a refused or unknown field) and garbage,
with a fixed seed and no example database.

Every answer must keep the API's promises: no 5xx but the documented 503s with
Retry-After, every error in its API's shape (OpenAI's; Anthropic's on /v1/messages),
every stream well-formed and ended ([DONE] or an error event; the Responses API's events
named and numbered up to response.completed/incomplete/failed; the Messages API's from
message_start to message_stop or an error), output under a JSON format beginning as
JSON, no traceback in the server's log; and after the run a plain request and a stream
of each API still get 200 and /health says ok. A failure is reported shrunk to a minimal
request, one per kind. A longer run: `python -m tests.fuzz --examples 2000` (tests/fuzz/
says more).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.check import check
from fuzz.exchange import PREVIOUS_CALL, PREVIOUS_ID, FuzzRequest, Outcome, Raw, encode
from fuzz.search import after_run, fuzz, tracebacks
from fuzz.streams import server_sent_events
from fuzz.target import Target, follow_up
from servers import ServerProcess

# About 25 s of requests on 2 cores when nothing fails (shrinking a failure adds more),
# shared among the endpoints as tests/fuzz/kinds.py's parts says.
EXAMPLES = 340
MAX_TOKENS = 4
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 2048, "--draft-max", 3, "--temperature", 0.8,
                       "--max-tokens", MAX_TOKENS], tmp_path_factory.mktemp("fuzz"))
    yield s
    s.kill()


def test_the_http_api_keeps_its_promises_under_fuzzing(server):
    target = Target(server.url, server.model, log=server.lines, timeout=60)
    try:
        report = fuzz(target, EXAMPLES, seed=0, max_tokens=MAX_TOKENS)
        after_run(target, report)
    finally:
        target.close()
    report.tracebacks = tracebacks(server.lines)
    summary = "\n".join(report.lines())
    print(summary)
    assert server.proc.poll() is None, f"the server exited:\n{server.stderr[-3000:]}"
    assert not report.failed, summary

    # The run reached what it must cover, answered (not only refused).
    assert report.requests >= EXAMPLES * 0.9  # (hypothesis may draw a few it throws away)
    kinds = {kind for kind, _ in report.statuses}
    assert {"chat", "chat stream", "completion", "completion stream", "responses",
            "responses stream", "responses follow-up", "responses stored", "messages",
            "messages stream", "count_tokens", "near chat", "near completion",
            "near responses", "near messages", "near count_tokens", "garbage",
            "other"} <= kinds, summary
    served = report.served
    # A forced tool answered in any API: the requests that follow stored responses vary
    # from run to run, and with them how many chat requests with tool_choice fit n_ctx
    # (0 to 2); tests/test_tools.py answers chat's own tool_choice every run.
    assert served["tool_choice"] + served["responses tool_choice"] + \
        served["messages tool_choice"] > 0, summary
    for feature in ("chat/completions", "completions", "stream", "tools",
                    "earlier tool calls", "response_format json_object",
                    "response_format json_schema",
                    "responses", "responses stream", "responses tools",
                    "responses input string", "responses function_call items",
                    "responses function_call_output items", "responses previous_response_id",
                    "messages", "messages stream", "messages tools", "messages tool_use blocks",
                    "messages tool_result blocks", "messages output_config.format",
                    "count_tokens"):
        assert served[feature] > 0, f"no 200 for a request with {feature}\n{summary}"
    assert served["GET /v1/responses/{id}"] + served["DELETE /v1/responses/{id}"] > 0, summary
    assert {status for _, status in report.statuses} >= {"200", "400", "404", "422"}


def test_the_long_run_starts_from_the_root_and_explains_itself():
    # its entry as the docs give it: a package inside tests/, which has no __init__.py
    done = subprocess.run([sys.executable, "-m", "tests.fuzz", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m tests.fuzz") and "--examples" in done.stdout


# ------------------------------------------------ the fuzzer's own judgement, no server

CHAT = "/v1/chat/completions"
ERROR = '{"error": {"message": "m", "type": "invalid_request_error", "param": null, "code": null}}'


def post(body: dict, path: str = CHAT) -> FuzzRequest:
    return FuzzRequest("POST", path, encode(body))


def signatures(req, **outcome) -> list[str]:
    return [p.signature for p in check(req, Outcome(**outcome))]


def test_bodies_hold_what_json_dumps_cannot_write():
    body = encode({"a": Raw("1" * 5000), "b": [Raw("[" * 3 + "]" * 3)],
                        "c": "é\x00"})
    assert body == ('{"a": ' + "1" * 5000 + ', "b": [[[[]]]], "c": "é\\u0000"}').encode()
    assert "«'1' × 5000»" in repr(FuzzRequest("POST", CHAT, body))


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
    assert signatures(FuzzRequest("GET", "/health"), error="ReadTimeout: timed out") == \
        ["no answer to GET /health: ReadTimeout"]


def test_a_stream_ends_with_done_or_an_error_and_no_server_error():
    req = post({"model": "m", "stream": True})
    chunk = ('{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, '
             '"finish_reason": "stop"}]}')
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


def test_an_answer_has_the_choices_asked_for_each_keeping_the_format():
    """n (or n_cmpl) choices, indexed 0..n-1, whole and streamed (reassembled by index);
    a stream that an error event ended may lack the later ones."""
    req = post({"model": "m", "n": 2, "response_format": {"type": "json_object"}})

    def choice(i, content):
        return {"index": i, "message": {"content": content}, "finish_reason": "stop"}

    def whole(*choices):
        return json.dumps({"object": "chat.completion", "choices": list(choices)})

    def chunk(i, content, finish=None):
        return json.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": i, "delta": {"content": content}, "finish_reason": finish}]})

    assert signatures(req, status=200, text=whole(choice(0, "{}"), choice(1, "{}"))) == []
    wrong = [f"200 on POST {CHAT}: not a chat.completion of its n choices"]
    assert signatures(req, status=200, text=whole(choice(0, "{}"))) == wrong
    assert signatures(req, status=200, text=whole(choice(1, "{}"), choice(0, "{}"))) == wrong
    assert signatures(req, status=200, text=whole(choice(0, "{}"), choice(1, "no"))) == \
        [f"200 on POST {CHAT}: response_format json_object not followed"]
    stream = {**req.json, "stream": True}
    events = [chunk(0, "{"), chunk(0, "}", "stop"), chunk(1, "{}", "stop"), "[DONE]"]
    assert signatures(post(stream), status=200, events=events) == []
    assert signatures(post(stream), status=200, events=events[:2] + ["[DONE]"]) == \
        [f"stream on POST {CHAT}: not its n choices"]
    assert signatures(post(stream), status=200, events=events[:2] + [ERROR, "[DONE]"]) == []
    assert signatures(post({**stream, "n_cmpl": 1}), status=200,
                      events=events[:2] + ["[DONE]"]) == []


def test_output_under_a_json_response_format_that_stopped_is_json():
    req = post({"model": "m", "response_format": {"type": "json_object"}})

    def answer(content, finish="stop"):
        return json.dumps({"object": "chat.completion", "choices": [
            {"index": 0, "message": {"content": content}, "finish_reason": finish}]})

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


RESPONSES, MESSAGES, COUNT = "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
ANTHROPIC_ERROR = '{"type": "error", "error": {"type": "invalid_request_error", "message": "m"}}'


def test_each_api_answers_errors_in_its_own_shape():
    assert signatures(post({}, RESPONSES), status=400, text=ERROR) == []
    assert signatures(post({}, RESPONSES), status=400, text=ANTHROPIC_ERROR) == \
        [f"400 on POST {RESPONSES}: not OpenAI's error shape"]
    for path in (MESSAGES, COUNT):
        assert signatures(post({}, path), status=400, text=ANTHROPIC_ERROR) == []
        assert signatures(post({}, path), status=404, text=ERROR) == \
            [f"404 on POST {path}: not Anthropic's error shape"]
    # the guard's refusals too come in the asking API's shape
    assert signatures(post({}, MESSAGES), status=415, text=ANTHROPIC_ERROR) == []
    assert signatures(post({}, MESSAGES), status=415, text=ERROR) == \
        [f"415 on POST {MESSAGES}: not Anthropic's error shape"]
    # a wrong method, answered before any route: either shape
    wrong_method = FuzzRequest("GET", MESSAGES, content_type=None)
    assert signatures(wrong_method, status=405, text=ERROR) == []
    assert signatures(wrong_method, status=405, text='{"detail": "x"}') != []
    # a 503 in Anthropic's shape: overloaded_error, with Retry-After
    busy = '{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}'
    assert signatures(post({}, MESSAGES), status=503, text=busy, headers={"retry-after": "2"}) \
        == []
    assert signatures(post({}, MESSAGES), status=500, text=busy.replace(
        "overloaded_error", "api_error").replace("busy", "internal server error"),
        log=["internal error on POST: KeyError: 'x'"]) == [f"500 on POST {MESSAGES}: KeyError"]


def test_count_tokens_refusing_for_a_max_tokens_it_has_not_is_a_failure():
    refusal = ANTHROPIC_ERROR.replace('"m"', '"thinking.budget_tokens: must be less than '
                                             'max_tokens"')
    assert signatures(post({"model": "m"}, COUNT), status=400, text=refusal) == \
        [f"400 on POST {COUNT}: refused for the max_tokens it has not"]
    assert signatures(post({"model": "m", "max_tokens": 5}, COUNT), status=400,
                      text=refusal) == []


def sse(*events: dict) -> dict:
    """An Outcome's stream: each event named by its type."""
    return {"status": 200, "names": [e["type"] for e in events],
            "events": [json.dumps(e) for e in events]}


def response(status: str, text: str = "", error=None) -> dict:
    return {"object": "response", "status": status, "error": error, "output": [
        {"type": "message", "content": [{"type": "output_text", "text": text}]}]}


def numbered(*events: dict) -> list[dict]:
    return [{**e, "sequence_number": i} for i, e in enumerate(events)]


def test_a_responses_stream_is_named_numbered_and_ended():
    req = post({"model": "m", "stream": True}, RESPONSES)
    created = {"type": "response.created", "response": response("in_progress")}
    delta = {"type": "response.output_text.delta", "delta": "Hi"}
    good = numbered(created, delta, {"type": "response.completed",
                                     "response": response("completed", "Hi")})
    assert signatures(req, **sse(*good)) == []
    named_wrong = {**sse(*good), "names": ["response.created", "delta", "response.completed"]}
    assert signatures(req, **named_wrong) == \
        [f"stream on POST {RESPONSES}: an event named other than its type"]
    backwards = [good[0], {**good[1], "sequence_number": 0}, good[2]]
    assert signatures(req, **sse(*backwards)) == \
        [f"stream on POST {RESPONSES}: sequence_number not increasing"]
    assert signatures(req, **sse(*good[:2])) == \
        [f"stream on POST {RESPONSES} without response.completed, .incomplete or .failed"]
    other_text = numbered(created, delta, {"type": "response.completed",
                                           "response": response("completed", "Ho")})
    assert signatures(req, **sse(*other_text)) == \
        [f"stream on POST {RESPONSES}: the text deltas are not the Response's text"]
    # an error after the start: `error`, then response.failed; a server error is a failure
    failed = numbered(created, {"type": "error", "code": None, "message": "m", "param": None},
                      {"type": "response.failed", "response": response(
                          "failed", error={"code": "invalid_request_error", "message": "m"})})
    assert signatures(req, **sse(*failed)) == []
    failed[2]["response"]["error"] = {"code": "server_error",
                                      "message": "generation failed: IndexError: x"}
    assert signatures(req, **sse(*failed)) == \
        [f"stream on POST {RESPONSES}: server_error event: IndexError"]
    # a JSON text.format kept
    fmt = post({"model": "m", "stream": True, "text": {"format": {"type": "json_object"}}},
               RESPONSES)
    assert signatures(fmt, **sse(*good)) == \
        [f"200 on POST {RESPONSES}: text.format json_object not followed"]


def test_a_messages_stream_is_named_and_ends_with_message_stop_or_an_error():
    req = post({"model": "m", "stream": True}, MESSAGES)
    start = {"type": "message_start", "message": {"type": "message", "content": []}}
    blocks = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
              {"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": "Hi"}},
              {"type": "content_block_stop", "index": 0}]
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    stop = {"type": "message_stop"}
    assert signatures(req, **sse(start, {"type": "ping"}, *blocks, delta, stop)) == []
    assert signatures(req, **sse(start, *blocks, delta)) == \
        [f"stream on POST {MESSAGES} without message_stop or an error"]
    assert signatures(req, **sse(*blocks, delta, stop)) == \
        [f"stream on POST {MESSAGES}: does not begin with message_start"]
    assert signatures(req, **sse(start, blocks[0], blocks[0], delta, stop)) == \
        [f"stream on POST {MESSAGES}: content_block_start out of place"]
    assert signatures(req, **sse(start, *blocks, stop)) == \
        [f"stream on POST {MESSAGES}: message_stop without a message_delta's stop_reason"]
    error = json.loads(ANTHROPIC_ERROR)
    assert signatures(req, **sse(start, blocks[0], error)) == []
    assert signatures(req, **sse(start, error, stop)) == \
        [f"stream on POST {MESSAGES}: events after message_stop or an error"]
    server = {"type": "error", "error": {"type": "api_error",
                                         "message": "generation failed: IndexError: x"}}
    assert signatures(req, **sse(start, server)) == \
        [f"stream on POST {MESSAGES}: api_error event: IndexError"]
    fmt = post({"model": "m", "stream": True, "output_config": {"format": {
        "type": "json_schema", "schema": {}}}}, MESSAGES)
    assert signatures(fmt, **sse(start, *blocks, delta, stop)) == \
        [f"200 on POST {MESSAGES}: output_config.format json_schema not followed"]


def test_server_sent_events_are_split_at_cr_and_lf_only():
    chunks = ['event: a\r', '\ndata: {"t": "x\u2028y\x85"}\r\n\r\n: ping\n\n', "data: 1\n",
              "data: 2"]
    assert list(server_sent_events(chunks)) == [("a", '{"t": "x\u2028y\x85"}'),
                                                     (None, "1\n2")]


def test_a_follow_up_names_the_first_answer():
    req = FuzzRequest("POST", RESPONSES, encode(
        {"previous_response_id": PREVIOUS_ID, "input": [
            {"type": "function_call_output", "call_id": PREVIOUS_CALL, "output": ""}]}))
    first = {"id": "resp_1", "output": [{"type": "function_call", "call_id": "call_9"}]}
    assert follow_up(req, first).json == {"previous_response_id": "resp_1", "input": [
        {"type": "function_call_output", "call_id": "call_9", "output": ""}]}
    stored = FuzzRequest("GET", f"{RESPONSES}/{PREVIOUS_ID}")
    assert follow_up(stored, first).path == f"{RESPONSES}/resp_1"
    assert follow_up(stored, None) == stored  # no answer: the placeholder stays


def test_an_answer_keeps_to_the_requests_stops_tools_and_token_limit():
    req = post({"model": "m", "max_tokens": 4, "stop_sequences": ["END"],
                "tools": [{"name": "add"}]}, MESSAGES)

    def message(stop="end_turn", sequence=None, used=4, name="add"):
        return json.dumps({"type": "message", "role": "assistant", "stop_reason": stop,
                           "stop_sequence": sequence, "usage": {"output_tokens": used},
                           "content": [{"type": "tool_use", "name": name, "input": {}}]})

    assert signatures(req, status=200, text=message()) == []
    assert signatures(req, status=200, text=message("stop_sequence", "END")) == []
    assert signatures(req, status=200, text=message("stop_sequence", "\nUser:")) == \
        [f"200 on POST {MESSAGES}: stop_reason stop_sequence with stop_sequence set"]
    assert signatures(req, status=200, text=message(sequence="END")) == \
        [f"200 on POST {MESSAGES}: stop_reason end_turn with stop_sequence set"]
    assert signatures(req, status=200, text=message(name="sub")) == \
        [f"200 on POST {MESSAGES}: a call of a tool not among the tools"]
    assert signatures(req, status=200, text=message(used=5)) == \
        [f"200 on POST {MESSAGES}: more output tokens than max_tokens"]
    responses = post({"model": "m", "max_output_tokens": 2}, RESPONSES)
    body = {**response("incomplete", "Hi"), "usage": {"output_tokens": 3}}
    assert signatures(responses, status=200, text=json.dumps(body)) == \
        [f"200 on POST {RESPONSES}: more output tokens than max_output_tokens"]
