"""The official OpenAI and Anthropic Python SDKs as real clients of a running gateway.

The Rust test `tests/e2e/sdk_clients.rs` starts mock upstreams speaking each provider protocol and a
gateway in front of them, then runs this file with SWITCHYARD_URL and SWITCHYARD_KEY set. Every
client API is exercised against every upstream protocol: the SDK must parse every answer and the
content must be what the upstream said.
"""

import json
import os

import anthropic
import openai
import pytest

BASE = os.environ["SWITCHYARD_URL"]
KEY = os.environ.get("SWITCHYARD_KEY", "sk-test")

# One public model per upstream protocol (see sdk_clients.rs).
UPSTREAMS = ["via-openai", "via-responses", "via-anthropic"]

WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

WEATHER_TOOL_RESPONSES = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER_TOOL_OPENAI["function"]["parameters"],
}

WEATHER_TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": WEATHER_TOOL_OPENAI["function"]["parameters"],
}


@pytest.fixture(scope="module")
def oai():
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def claude():
    return anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=30)


@pytest.mark.parametrize("model", UPSTREAMS)
def test_chat_completions_create(oai, model):
    r = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert r.choices[0].message.content.startswith("Hello from")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens > 0
    assert r.model == model


@pytest.mark.parametrize("model", UPSTREAMS)
def test_chat_completions_stream(oai, model):
    stream = oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert text.startswith("Hello from")
    # Every token arrived, in order: the streamed text is the whole answer's.
    whole = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert text == whole.choices[0].message.content
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


@pytest.mark.parametrize("model", UPSTREAMS)
def test_chat_completions_tool_call(oai, model):
    r = oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL_OPENAI],
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("model", UPSTREAMS)
def test_chat_completions_tool_call_stream(oai, model):
    stream = oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL_OPENAI],
        stream=True,
    )
    name, args, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                name += tc.function.name or "" if tc.function else ""
                args += tc.function.arguments or "" if tc.function else ""
            finish = choice.finish_reason or finish
    assert name == "get_weather"
    assert json.loads(args) == {"city": "Paris"}
    assert finish == "tool_calls"


@pytest.mark.parametrize("model", UPSTREAMS)
def test_responses_create(oai, model):
    r = oai.responses.create(model=model, input="Say hello.", instructions="Be brief.")
    assert r.output_text.startswith("Hello from")
    assert r.status == "completed"
    assert r.usage.output_tokens > 0


@pytest.mark.parametrize("model", UPSTREAMS)
def test_responses_stream(oai, model):
    text, completed = "", None
    with oai.responses.stream(model=model, input="Say hello.") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
            elif event.type == "response.completed":
                completed = event.response
    assert text.startswith("Hello from")
    assert completed is not None and completed.output_text == text


@pytest.mark.parametrize("model", UPSTREAMS)
def test_responses_tool_call(oai, model):
    r = oai.responses.create(
        model=model, input="Weather in Paris?", tools=[WEATHER_TOOL_RESPONSES]
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}


@pytest.mark.parametrize("model", UPSTREAMS)
def test_messages_create(claude, model):
    r = claude.messages.create(
        model=model,
        max_tokens=256,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
    )
    assert r.content[0].type == "text"
    assert r.content[0].text.startswith("Hello from")
    assert r.stop_reason == "end_turn"
    assert r.usage.output_tokens > 0


@pytest.mark.parametrize("model", UPSTREAMS)
def test_messages_stream(claude, model):
    with claude.messages.stream(
        model=model, max_tokens=256, messages=[{"role": "user", "content": "Say hello."}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Hello from")
    assert final.stop_reason == "end_turn"
    assert final.content[0].text == text
    # Every token arrived, in order: the streamed text is the whole answer's.
    whole = claude.messages.create(
        model=model, max_tokens=256, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert text == whole.content[0].text


@pytest.mark.parametrize("model", UPSTREAMS)
def test_messages_tool_use(claude, model):
    r = claude.messages.create(
        model=model,
        max_tokens=256,
        tools=[WEATHER_TOOL_ANTHROPIC],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert r.stop_reason == "tool_use"
    use = [b for b in r.content if b.type == "tool_use"][0]
    assert use.name == "get_weather"
    assert use.input == {"city": "Paris"}


@pytest.mark.parametrize("model", UPSTREAMS)
def test_messages_tool_use_stream(claude, model):
    with claude.messages.stream(
        model=model,
        max_tokens=256,
        tools=[WEATHER_TOOL_ANTHROPIC],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    use = [b for b in final.content if b.type == "tool_use"][0]
    assert use.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


def test_embeddings(oai):
    r = oai.embeddings.create(model="embed", input=["hello", "world"])
    assert len(r.data) == 2
    assert len(r.data[0].embedding) > 0


def test_count_tokens(claude):
    r = claude.messages.count_tokens(
        model="via-openai", messages=[{"role": "user", "content": "abcd" * 10}]
    )
    assert r.input_tokens == 10


def test_bad_request_is_an_sdk_error_in_each_protocol(oai, claude):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(
            model="nope", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="via-openai", max_tokens=10, messages=[])
    assert "invalid chat request body" in str(err.value)
