"""A property-based fuzzer of `specllama serve`'s HTTP API, on hypothesis.

Requests are drawn from strategies that follow the request models of the four generation
endpoints (specllama/server/schema.py, apis/responses_schema.py, apis/messages_schema.py):

- Chat Completions and Completions: roles, content parts, earlier tool calls, tools and
  tool_choice, response_format with JSON schemas valid and not, stop strings, logprobs,
  every sampling field at its edges (a temperature of 1e-38, a seed of 2**64), streams
  with and without usage;
- the Responses API (POST /v1/responses): input as a string or items (messages with
  text parts, function_call and function_call_output items, reasoning sent back), function
  tools with each tool_choice, text.format, instructions, reasoning, store, the fields it
  ignores or takes at their no-op values, streams; and follow-ups on a stored response
  (previous_response_id, with the output of its call; GET and DELETE /v1/responses/{id});
- the Messages API (POST /v1/messages and /v1/messages/count_tokens): system, text,
  tool_use, tool_result and thinking blocks, tools with each tool_choice, thinking,
  output_config (effort, format), stop_sequences, cache_control, streams;

near-well-formed ones (such a body with one value replaced by a wrong type, a number out
of range or of 5,000 digits, NaN, a deep nesting, or a field taken out, a field the API
refuses or does not know added, another model); garbage (bytes that are not UTF-8, JSON
that is not an object, bodies cut short, nested 100,000 deep, over the 4 MiB limit, sent
as text/plain) to each endpoint; and GETs of /v1/models, /health, /metrics, unknown paths
and wrong methods. Every answer must keep the API's promises:

- no 5xx but the documented 503s (queue full, engine down, shutting down), each with
  a Retry-After;
- every error in its API's shape: OpenAI's, {"error": {"message": str, "type": str,
  "param": str|null, "code": str|null}} (schema.APIError.body); on the Messages API's
  routes Anthropic's, {"type": "error", "error": {"type": str, "message": str}} (the
  guard's 403 and 415 too); and count_tokens never
  refuses for the max_tokens it does not take;
- a 200 is JSON of its endpoint's object (a chat.completion, a Response, a Message, a
  token count); a stream, read to its end, is well-formed:
  - Chat Completions and Completions: server-sent events that end with `data: [DONE]`
    or an error event, each event a chunk or, last, an error whose type is not
    server_error (but a 503's);
  - Responses: each event's name its data's `type`, sequence_number increasing, from
    response.created to one response.completed, .incomplete or .failed (after an `error`
    event, if any; not for a server error), the text deltas adding up to the Response's;
  - Messages: each event's name its data's `type`, message_start first, message_stop
    last unless an `error` event (not api_error) ended it, content blocks one at a time
    (start, deltas, stop) and one message_delta with a stop_reason after them;
- output under a JSON format (response_format, text.format, output_config.format) begins
  as JSON does, and is JSON when it stopped on its own (no stop string);
- no traceback in the server's log, and after the run a plain request and a stream to
  each of Chat Completions, Responses and Messages still get 200, count_tokens a count,
  and /health says ok.

The search draws `--examples` requests, shared among the kinds of request (`parts`: of
40, chat 7, completion 3, Responses 6, stored responses 2, Messages 6, count_tokens 2,
near-well-formed 8, garbage 3, others 3), and fails on none (hypothesis stops drawing
soon after a first failure). Then each kind of failure found (the status, the path and
the exception the server answered or logged) is shrunk by hypothesis to a minimal
request: it draws the same requests again from the same seed, this time failing on them.

    python -m tests.fuzz --examples 2000                     # the default pair, smollm2
    python -m tests.fuzz --target t.gguf --draft d.gguf --examples 300 --seed 1
    python -m tests.fuzz --url http://127.0.0.1:8080 --examples 500   # a server running

It starts `specllama serve` on a loopback port (`--serve-args` for more flags) and stops it
at the end; with `--url` it fuzzes that server instead (without its log, so a 500 is named
by its answer only). Nothing is written outside a temporary folder (no example database;
hypothesis' caches in a temporary home) but `--json FILE`. Exit status 1 when a failure
was found. tests/test_fuzz.py runs a bounded run on the tiny models.

It is test code, so it lives in tests/ (run from the repository root, as above); the tests
import it as `fuzz` (pytest puts tests/ on sys.path), hence the relative imports within.

The package, a module a job: the requests (exchange: what is sent and answered; values:
the strategies' building blocks; chat, responses, messages: each API's bodies; apis: the
endpoints and what they refuse; broken: near-well-formed and garbage requests; kinds: the
parts and their shares), the judgement of answers (check; errors: error shapes and 5xx;
promises: what a 200's output keeps; streams: server-sent events and each API's event
order), and the run (target: the server; search: hypothesis' search and shrinking;
report; cli, run by __main__).
"""

from .cli import main as main
