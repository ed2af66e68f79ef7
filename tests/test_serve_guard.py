"""The browser boundary of `specllama serve` (server/guard.py): Host, Origin and
Content-Type checks, CORS answers, /health behind the key and the limit on requests in
progress, on real server processes with the tiny models, as a browser and curl would
send them."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from click.testing import CliRunner
from servers import ServerProcess, starting

from specllama.cli import cli

KEY = "s3cret"
ALLOWED = "http://app.example:3000"


@pytest.fixture(scope="module")
def start(tiny_target, tiny_draft, tmp_path_factory):
    with starting(tmp_path_factory, "guard", "--target", tiny_target, "--draft", tiny_draft,
                  "--threads", 1, "--n-ctx", 256, "--draft-max", 2, "--max-tokens", 4) as make:
        yield make


@pytest.fixture(scope="module")
def plain(start) -> ServerProcess:
    """As a user starts it: 127.0.0.1, no key, no --allowed-origins."""
    return start()


@pytest.fixture(scope="module")
def keyed(start) -> ServerProcess:
    return start("--api-key", KEY, "--allowed-origins", f"{ALLOWED}/, chrome-extension://*",
                 "--allowed-origins", "https://other.example")


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


def call(server: ServerProcess, method: str, path: str, *, headers=None, key: str | None = None,
         json: bool = True, content: bytes | None = None) -> httpx.Response:
    """A request to the server's socket; `headers` may name another Host, as a page
    reaching it through DNS rebinding would."""
    sent = {"Content-Type": "application/json"} if json else {}
    if key:
        sent["Authorization"] = f"Bearer {key}"
    if content is None and method == "POST":
        content = (b'{"model": "%s", "prompt": "hi", "max_tokens": 2}'
                   % server.model.encode())
    return httpx.request(method, f"{server.url}{path}", content=content, timeout=30,
                         headers={**sent, **(headers or {})})


def refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "invalid_request_error", error
    assert "access-control-allow-origin" not in r.headers


# ------------------------------------------------------------------------------- Host


def test_a_host_header_must_name_this_machine(plain):
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends
    its own name as Host; it gets 403 on every route, before any work."""
    before = plain.health()["requests"]
    port = port_of(plain)
    for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}",
                 f"10.1.2.3:{port}"):
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"),
                             ("GET", "/health"), ("GET", "/metrics")):
            r = call(plain, method, path, headers={"Host": host})
            refused(r, 403, "forbidden_host")
            assert host in r.json()["error"]["message"]
    assert plain.health()["requests"] == before
    # Names of this machine, with any port or none.
    for host in (f"localhost:{port}", "localhost", f"127.0.0.1:{port}", f"[::1]:{port}",
                 f"LOCALHOST:{port}", f"app.localhost:{port}", f"127.0.0.2:{port}",
                 f"{socket.gethostname()}:{port}"):
        r = call(plain, "GET", "/v1/models", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)
    r = call(plain, "POST", "/v1/completions", headers={"Host": f"localhost:{port}"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None


def test_bound_to_all_interfaces_any_host_is_served_and_the_key_guards(start):
    """As Ollama: reachable from anywhere, names are many; the key is the guard. A page's
    Origin is still checked."""
    server = start("--host", "0.0.0.0", "--api-key", KEY)
    headers = {"Host": f"evil.example:{port_of(server)}"}
    assert call(server, "GET", "/v1/models", headers=headers).status_code == 401
    assert call(server, "POST", "/v1/completions", headers=headers, key=KEY).status_code == 200
    refused(call(server, "POST", "/v1/completions", key=KEY,
                 headers={**headers, "Origin": "http://evil.example"}), 403, "forbidden_origin")
    server.stop()


# ----------------------------------------------------------------------------- Origin


def test_a_foreign_origin_is_refused_without_cors_headers(plain):
    port = port_of(plain)
    for origin in ("https://evil.example", f"http://localhost:{port + 1}", "null",
                   f"http://evil.example:{port}", "file://"):
        refused(call(plain, "POST", "/v1/completions", headers={"Origin": origin}),
                403, "forbidden_origin")
        refused(call(plain, "GET", "/v1/models", headers={"Origin": origin}),
                403, "forbidden_origin")
        preflight = call(plain, "OPTIONS", "/v1/chat/completions", json=False, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        refused(preflight, 403, "forbidden_origin")


def test_this_servers_own_origins_and_clients_without_one_are_served(plain):
    port = port_of(plain)
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                   f"http://[::1]:{port}"):
        r = call(plain, "POST", "/v1/completions", headers={"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
    r = call(plain, "POST", "/v1/completions")  # curl, an SDK: no Origin, no CORS headers
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_allowed_origins_get_matching_cors_answers(keyed):
    for origin in (ALLOWED, "https://other.example", "chrome-extension://abcdefgh"):
        r = call(keyed, "POST", "/v1/completions", key=KEY, headers={"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
        assert "Origin" in r.headers["vary"]
        # An error for an allowed page carries them too, so the page can read it.
        r = call(keyed, "GET", "/v1/models", headers={"Origin": origin})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin
    for origin in ("http://app.example:3001", "https://app.example:3000",
                   "http://sub.app.example:3000", "https://other.example.evil"):
        refused(call(keyed, "POST", "/v1/completions", key=KEY, headers={"Origin": origin}),
                403, "forbidden_origin")


def test_a_preflight_from_an_allowed_origin_is_answered(keyed):
    r = call(keyed, "OPTIONS", "/v1/chat/completions", json=False, headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == ALLOWED
    assert {"GET", "POST"} <= {m.strip() for m in
                               r.headers["access-control-allow-methods"].split(",")}
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-stainless-os"} <= allowed
    assert int(r.headers["access-control-max-age"]) > 0


def test_any_origin_with_a_star(start):
    server = start("--allowed-origins", "*")
    r = call(server, "POST", "/v1/completions", headers={"Origin": "https://any.example"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://any.example"
    server.stop()


def test_allowed_origins_that_are_not_origins_are_refused(tmp_path):
    args = ["serve", "--port", "0", "--target", str(tmp_path / "missing.gguf"),
            "--draft", "lookup"]
    result = CliRunner().invoke(cli, [*args, "--allowed-origins", "http://a.example/path"])
    assert result.exit_code == 2 and "'http://a.example/path' is not an origin" in result.output
    # also from the environment, as the key is
    result = CliRunner().invoke(cli, args, env={"SPECLLAMA_ALLOWED_ORIGINS": "app.example"})
    assert result.exit_code == 2 and "'app.example' is not an origin" in result.output


# ----------------------------------------------------------------------- Content-Type


def test_a_post_that_is_not_json_is_refused_with_415_before_any_work(plain):
    """text/plain, a form or no type: what a page may POST without a preflight."""
    before = plain.health()["requests"]
    for content_type in ("text/plain", "text/plain;charset=UTF-8",
                         "application/x-www-form-urlencoded", "multipart/form-data", None):
        headers = {} if content_type is None else {"Content-Type": content_type}
        r = call(plain, "POST", "/v1/chat/completions", json=False, headers=headers)
        refused(r, 415, "unsupported_media_type")
        assert "application/json" in r.json()["error"]["message"]
    assert plain.health()["requests"] == before
    r = call(plain, "POST", "/v1/completions",
             headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------------------ /health


def test_health_without_the_key_says_only_that_the_server_is_alive(keyed, plain):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(f"{keyed.url}/health", headers=headers, timeout=10)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    full = httpx.get(f"{keyed.url}/health", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=10).json()
    figures = {"status", "model", "busy", "serving", "parallel", "waiting", "requests",
               "cache", "prompt_cache", "engine_pid"}
    assert figures <= set(full) and full["engine_pid"] > 0
    # No key configured: nothing to hide behind, the whole body as before.
    assert figures <= set(plain.health())


# ------------------------------------------------------------------- connection flood


def test_past_the_request_limit_a_request_gets_the_apis_503_and_health_gets_through(start):
    """--parallel 1 --queue 0 leaves room for 33 requests in progress at once (served,
    waiting and 32 more): here 33 whose bodies never come. One more is answered 503 at
    once, in the API's shape with Retry-After (not uvicorn's plain text), while /health
    still answers; once they go, requests are served again."""
    server = start("--queue", 0)
    host, port = server.url.split("//")[1].rsplit(":", 1)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()
    slow = []
    try:
        for _ in range(33):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head)
            slow.append(sock)
            time.sleep(0.02)  # one at a time, as uvicorn alone then refused the 33rd
        for _ in range(100):  # until the server has read every one's headers
            r = httpx.get(f"{server.url}/v1/models", timeout=10)
            if r.status_code == 503:
                break
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/json"
        assert r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"], error["param"]) == (
            "server_error", "too_many_requests", None)
        assert "33 requests" in error["message"]
        post = call(server, "POST", "/v1/completions")
        assert post.status_code == 503 and post.json()["error"]["code"] == "too_many_requests"
        health = httpx.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok"
    finally:
        for sock in slow:
            sock.close()
    for _ in range(100):  # the server sees the closes in its own time
        if httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 200:
            break
    else:
        raise AssertionError("still 503 once the requests went")
    assert call(server, "POST", "/v1/completions").status_code == 200
    server.stop()
