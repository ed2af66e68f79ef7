"""The OpenAI Agents SDK (`openai-agents`) against a real `specllama serve`: an agent with
one function tool, run to completion, over the Responses API (the SDK's default model)
and over Chat Completions. The tiny pair is a random model, so the run is made to end
whatever it writes: the tool is required, one call at a time, and the run stops at the
first tool's result (`stop_on_first_tool`), which is the final output. On a reasoning
pair, a second turn takes the first's reasoning item, call and result back, as the SDK
sends them. Tracing is off: nothing leaves the machine."""

from __future__ import annotations

import asyncio
from typing import Annotated

import jsonschema
import pytest
from pydantic import Field
from servers import ServerProcess

agents = pytest.importorskip(
    "agents", reason="an OpenAI Agents SDK agent is the client: pip install -e '.[test]'")

from agents import (  # noqa: E402
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    ToolsToFinalOutputResult,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 2048, "--draft-max", 3, "--max-tokens", 120],
                      tmp_path_factory.mktemp("agents"))
    yield s
    s.kill()


@pytest.fixture(autouse=True, scope="module")
def _no_tracing():
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def weather_agent(model) -> tuple[Agent, FunctionTool, list[dict]]:
    """An agent with one tool that records the arguments it ran with."""
    ran: list[dict] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=16)],
                    days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """The weather forecast for a city.

        Args:
            city: The city's name.
            days: How many days ahead.
        """
        ran.append({"city": city, "days": days})
        return f"sunny in {city} for {days} days"

    agent = Agent(name="forecaster", instructions="Answer with the weather tool.",
                  tools=[get_weather], model=model, tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                               temperature=1.0, extra_body={"seed": 3}))
    return agent, get_weather, ran


def client(server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                       timeout=60)


ASK = "What will the weather be in Paris this week?"


async def streamed(agent: Agent):
    result = Runner.run_streamed(agent, ASK, max_turns=2)
    kinds = [event.type async for event in result.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    return result


@pytest.mark.parametrize("api", ["responses", "responses_streamed", "chat_completions"])
def test_an_agent_with_one_tool_runs_to_completion(server, api):
    model = OpenAIChatCompletionsModel(model=server.model, openai_client=client(server)) \
        if api == "chat_completions" else \
        OpenAIResponsesModel(model=server.model, openai_client=client(server))
    agent, tool, ran = weather_agent(model)
    result = asyncio.run(streamed(agent)) if api.endswith("streamed") else \
        Runner.run_sync(agent, ASK, max_turns=2)
    [arguments] = ran  # the tool ran once, with arguments its schema admits
    jsonschema.validate(arguments, tool.params_json_schema)
    assert result.final_output == f"sunny in {arguments['city']} for {arguments['days']} days"
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(calls) == 1 and calls[0].raw_item.name == "get_weather"
    assert [o.output for o in outputs] == [result.final_output]
    [response] = result.raw_responses
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0


@pytest.fixture(scope="module")
def thinker(tiny_model_factory, tmp_path_factory):
    """A pair that reasons before it answers, and closes its reasoning (see
    test_serve_reasoning.py)."""
    from test_serve_reasoning import SWITCH, pair

    target, draft = pair(tiny_model_factory, SWITCH)
    s = ServerProcess(["--target", target, "--draft", draft, "--threads", 1, "--n-ctx", 4096,
                       "--draft-max", 3, "--max-tokens", 200],
                      tmp_path_factory.mktemp("agents-thinker"))
    yield s
    s.kill()


def test_a_reasoning_agent_sends_its_reasoning_back_and_goes_on(thinker):
    """Two turns: the first answer's reasoning and call go back with the call's result, as
    the SDK sends them (a reasoning item included), and the second turn calls again."""
    agent, tool, ran = weather_agent(OpenAIResponsesModel(model=thinker.model,
                                                          openai_client=client(thinker)))

    def after_two_calls(context, results: list) -> ToolsToFinalOutputResult:
        return ToolsToFinalOutputResult(is_final_output=len(ran) == 2,
                                        final_output=results[-1].output)

    agent = agent.clone(tool_use_behavior=after_two_calls, reset_tool_choice=False)
    result = Runner.run_sync(agent, ASK, max_turns=3)
    assert len(ran) == 2 and len(result.raw_responses) == 2
    for arguments in ran:
        jsonschema.validate(arguments, tool.params_json_schema)
    assert result.final_output == f"sunny in {ran[1]['city']} for {ran[1]['days']} days"
    kinds = [i.type for i in result.new_items]
    assert kinds.count("reasoning_item") >= 1, kinds
    assert kinds.count("tool_call_item") == 2 and kinds.count("tool_call_output_item") == 2
