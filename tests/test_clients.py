"""The client libraries people point at a local OpenAI- or Anthropic-compatible server, run
against a real `specllama serve` of the tiny pair: instructor, pydantic-ai, Simon
Willison's `llm`, the OpenAI Agents SDK (tools and a structured output), and the Vercel AI
SDK through node (tests/clients/). The tiny pair writes random text, but tool calls and
JSON-schema output are held to their schema by a grammar, so what each client parses back
is checked: its type, its fields, the tool it called and the arguments; a seed makes each
sampled run the same run. Plain text is greedy and checked against the same request made
with the openai client."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from servers import ServerProcess

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).parent / "clients"
SEED = 3
PROMPT = "Tell me about the rivers and the hills of France."


class City(BaseModel):
    # extra="forbid" is additionalProperties: false; without it the schema admits more
    # keys, and a random model writes them until max_tokens
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=16)
    population: int = Field(ge=0, le=100_000_000)
    continent: Literal["Europe", "Asia", "Africa"]


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=16)
    sky: Literal["sunny", "cloudy", "rainy"]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 2048, "--draft-max", 3, "--max-tokens", 300],
                      tmp_path_factory.mktemp("clients"))
    yield s
    s.kill()


def greedy_text(server, max_tokens: int = 16) -> str:
    """What the openai client gets for PROMPT, greedy: what each client must get too."""
    r = server.client().chat.completions.create(
        model=server.model, temperature=0, max_tokens=max_tokens,
        messages=[{"role": "user", "content": PROMPT}])
    assert r.choices[0].finish_reason == "length"
    return r.choices[0].message.content


# instructor: every release pins jiter<0.15 and rich<15, and openai>=3.4 needs jiter>=0.16,
# so it is no test dependency (it would hold openai at 3.3): installed by hand, it works.
INSTRUCTOR_MISSING = ("instructor is not a test dependency (its jiter<0.15 pin holds openai at "
                      "3.3): pip install --no-deps instructor to run it")


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_returns_a_pydantic_model(server, mode):
    instructor = pytest.importorskip("instructor", reason=INSTRUCTOR_MISSING)
    client = instructor.from_openai(server.client(), mode=getattr(instructor.Mode, mode))
    city, completion = client.chat.completions.create_with_completion(
        model=server.model, response_model=City, max_retries=0, max_tokens=300,
        temperature=1.0, seed=SEED, messages=[{"role": "user", "content": "Tell me about Paris."}])
    assert isinstance(city, City) and len(city.name) <= 16
    message = completion.choices[0].message
    if mode == "TOOLS":  # a call of the tool named after the model, forced
        assert completion.choices[0].finish_reason == "tool_calls"
        [call] = message.tool_calls
        assert call.function.name == "City"
        assert json.loads(call.function.arguments) == city.model_dump()
    else:  # response_format json_schema: the message's content is the object
        assert completion.choices[0].finish_reason == "stop"
        assert json.loads(message.content) == city.model_dump()


def test_pydantic_ai_agent_calls_its_tool_then_returns_its_output_type(server):
    pytest.importorskip("pydantic_ai", reason="pip install -e '.[test]' (pydantic-ai-slim)")
    from pydantic_ai import Agent, ModelSettings, RunContext
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def settings(ctx: RunContext) -> ModelSettings:
        # the random model is told which tool: the function tool first, then the output
        # tool pydantic-ai asks its output_type as (named, it ends the run)
        return ModelSettings(temperature=1.0, seed=SEED, max_tokens=300,
                             parallel_tool_calls=False,
                             tool_choice=["get_weather"] if ctx.run_step <= 1 else
                             ["final_result"])

    model = OpenAIChatModel(server.model, provider=OpenAIProvider(
        base_url=f"{server.url}/v1", api_key="unused"))
    agent = Agent(model, output_type=Forecast, instructions="Answer with the weather tool.",
                  model_settings=settings, retries=0)
    ran: list[str] = []

    @agent.tool_plain
    def get_weather(city: Annotated[str, Field(max_length=16)]) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    result = agent.run_sync("What is the weather in Paris?")
    assert isinstance(result.output, Forecast) and len(result.output.city) <= 16
    [city] = ran
    assert len(city) <= 16
    calls = [p for m in result.all_messages() for p in m.parts if p.part_kind == "tool-call"]
    assert [c.tool_name for c in calls] == ["get_weather", "final_result"]
    assert calls[0].args_as_dict() == {"city": city}
    assert Forecast.model_validate(calls[1].args_as_dict()) == result.output
    usage = result.usage
    assert usage.requests == 2 and usage.tool_calls == 1 and usage.output_tokens > 0


@pytest.fixture
def llm_model(server, tmp_path, monkeypatch):
    """`llm`'s model for the server, as its users add one: extra-openai-models.yaml."""
    llm = pytest.importorskip("llm", reason="pip install -e '.[test]' (llm)")
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specllama\n  model_name: {server.model}\n  api_base: {server.url}/v1\n"
        "  supports_schema: true\n")
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    return llm.get_model("specllama")


def test_llm_streams_the_greedy_text(server, llm_model):
    response = llm_model.prompt(PROMPT, max_tokens=16, temperature=0)
    assert response.text() == greedy_text(server)
    usage = response.usage()
    assert usage.output == 16 and usage.input > 0


def test_llm_with_a_schema_returns_its_json(llm_model):
    response = llm_model.prompt("Tell me about Paris.", schema=City, max_tokens=300,
                                temperature=1.0, seed=SEED)
    city = City.model_validate_json(response.text())
    assert len(city.name) <= 16


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_openai_agents_with_a_tool_and_an_output_type(server, api):
    pytest.importorskip("agents", reason="pip install -e '.[test]' (openai-agents)")
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=60)
    model = OpenAIResponsesModel(model=server.model, openai_client=client) \
        if api == "responses" else \
        OpenAIChatCompletionsModel(model=server.model, openai_client=client)
    ran: list[str] = []

    # the tool once (required), then gone: the second turn is the output alone
    @function_tool(is_enabled=lambda ctx, agent: not ran)
    def get_weather(city: Annotated[str, Field(max_length=16)]) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    agent = Agent(name="forecaster", instructions="Answer with the weather tool.",
                  tools=[get_weather], model=model, output_type=Forecast,
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                               temperature=1.0, max_tokens=300,
                                               extra_body={"seed": SEED}))
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert isinstance(result.final_output, Forecast)
    [city] = ran
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    assert [c.raw_item.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].raw_item.arguments) == {"city": city}


# -- the Vercel AI SDK (node) ------------------------------------------------------------


@pytest.fixture(scope="module")
def ai_sdk(tmp_path_factory) -> Path:
    """tests/clients/ with its packages installed (npm ci), in a temporary directory; npm's
    downloads are cached in the system's temporary directory, for the next run."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the Vercel AI SDK cases run in node (Node.js >= 18)")
    work = tmp_path_factory.mktemp("ai-sdk")
    for name in ("package.json", "package-lock.json", "aisdk.mjs"):
        shutil.copy(CLIENTS / name, work / name)
    cache = Path(tempfile.gettempdir()) / "specllama-tests-npm-cache"
    done = subprocess.run([npm, "ci", "--cache", str(cache), "--prefer-offline", "--no-audit",
                           "--no-fund", "--loglevel", "error"],
                          cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return work


def test_the_vercel_ai_sdk(ai_sdk, server):
    """One node run, all cases (one npm install and one node start): generateText,
    streamText, generateObject and a tool through @ai-sdk/openai-compatible, generateText
    through @ai-sdk/anthropic (/v1/messages)."""
    done = subprocess.run(["node", "aisdk.mjs", f"{server.url}/v1", server.model], cwd=ai_sdk,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    failed = {case: r["error"] for case, r in results.items() if "error" in r}
    assert not failed, failed
    text = greedy_text(server)

    r = results["generateText"]
    assert (r["text"], r["finishReason"]) == (text, "length")
    assert r["usage"]["outputTokens"] == 16 and r["usage"]["inputTokens"] > 0

    r = results["streamText"]  # the same text, as the pieces streamed add up, and its usage
    assert (r["text"], r["finishReason"]) == (text, "length")
    assert "".join(r["chunks"]) == text
    assert r["usage"]["outputTokens"] == 16

    r = results["generateObject"]  # response_format json_schema, parsed and checked
    city = r["object"]
    assert set(city) == {"name", "continent"} and r["finishReason"] == "stop"
    assert isinstance(city["name"], str) and len(city["name"]) <= 16
    assert city["continent"] in ("Europe", "Asia", "Africa")

    r = results["tools"]  # toolChoice "required": one call, run by the SDK
    [call] = r["toolCalls"]
    assert call["toolName"] == "weather" and set(call["input"]) == {"city"}
    assert r["ran"] == [call["input"]["city"]] and len(r["ran"][0]) <= 16
    assert r["toolResults"] == [{"toolName": "weather",
                                 "output": f"sunny in {call['input']['city']}"}]
    assert r["finishReason"] == "tool-calls"

    r = results["anthropic"]  # the same greedy answer through the Messages API
    assert (r["text"], r["finishReason"]) == (text, "length")
    assert r["usage"]["outputTokens"] == 16 and r["usage"]["inputTokens"] > 0
