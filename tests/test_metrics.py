"""/metrics in Prometheus' text format: a real server on 127.0.0.1, real clients, and the
exposition read back by Prometheus' own parser (prometheus_client)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess

from specllama.engine.loop.stats import Stats
from specllama.server.metrics import Histogram, Metrics, drafted
from specllama.server.promptcache import CacheFigures


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 256, "--draft-max", 3, "--temperature", 0, "--max-tokens", 16],
                      tmp_path_factory.mktemp("metrics"))
    yield s
    s.kill()


def scrape(server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{server.url}/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = list(text_string_to_metric_families(response.text))  # Prometheus parses it
    assert {f.name for f in families} >= {
        "specllama_requests", "specllama_tokens_generated", "specllama_tokens_drafted",
        "specllama_tokens_accepted", "specllama_engine_restarts",
        "specllama_requests_waiting", "specllama_requests_running",
        "specllama_time_to_first_token_seconds", "specllama_time_per_output_token_seconds"}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families for s in f.samples}


def test_the_counters_follow_the_requests(server):
    client = server.client()
    before = scrape(server)
    words = 0
    for _ in range(3):
        r = client.chat.completions.create(model=server.model, max_tokens=12,
                                           messages=[{"role": "user", "content": "the cat"}])
        words += r.usage.completion_tokens
    stream = client.chat.completions.create(model=server.model, max_tokens=12, stream=True,
                                            messages=[{"role": "user", "content": "a dog"}])
    for _ in stream:
        pass
    after = scrape(server)

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("specllama_requests_total", status="completed") == 4
    assert grew("specllama_tokens_generated_total") >= words
    assert grew("specllama_tokens_drafted_total", source="model") > 0
    assert 0 < grew("specllama_tokens_accepted_total", source="model") <= \
        grew("specllama_tokens_drafted_total", source="model")
    assert grew("specllama_time_per_output_token_seconds_count") == 4
    assert grew("specllama_time_to_first_token_seconds_count") == 1  # the streamed one
    assert after[("specllama_requests_waiting", ())] == 0
    assert after[("specllama_engine_restarts_total", ())] == 0


def test_a_clients_mistake_is_not_a_request_served(server):
    before = scrape(server)
    bad = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "nope",
                     "messages": [{"role": "user", "content": "x"}]}, timeout=30)
    assert bad.status_code == 404
    after = scrape(server)
    requests = [k for k in after if k[0] == "specllama_requests_total"]
    assert requests and all(after[k] == before.get(k, 0.0) for k in requests)


def test_histogram_buckets_are_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v)
    assert h.lines("x") == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1.0"} 3',
                            'x_bucket{le="+Inf"} 4', "x_sum 4.05", "x_count 4"]


def test_drafts_by_source_split_lookups_from_the_model():
    s = Stats(drafted=10, accepted=7, forced=3, forced_accepted=3,
              origin_drafted={"context": 4}, origin_accepted={"context": 3})
    assert drafted(s) == ({"model": 6, "context": 4, "forced": 3},
                          {"model": 4, "context": 3, "forced": 3})


def test_the_exposition_parses_back():
    m = Metrics()
    m.first_token(0.3)
    text = m.render(requests={"completed": 2, "rejected": 1}, restarts=0,
                    stats=Stats(tokens=40), waiting=1, running=1,
                    cache={"history": 50, "target": 49, "draft": 30, "consistent": True},
                    prompt_cache=CacheFigures(entries=2, bytes=4096, limit_bytes=8192, hits=3))
    samples = {(s.name, tuple(s.labels.items())): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("specllama_requests_total", (("status", "rejected"),))] == 1
    assert samples[("specllama_kv_cache_tokens", (("model", "draft"),))] == 30
    assert samples[("specllama_time_to_first_token_seconds_count", ())] == 1
    assert samples[("specllama_requests_running", ())] == 1
    assert samples[("specllama_prompt_cache_bytes", ())] == 4096
    assert samples[("specllama_prompt_cache_hits_total", ())] == 3
