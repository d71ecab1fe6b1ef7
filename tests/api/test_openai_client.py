"""The unmodified `openai` client against a real `localinfer serve`."""

from __future__ import annotations

import json
import math
import time

import openai
import pytest

from ..greedy import Reference
from .conftest import NO_END

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_embedded_model(client):
    ids = [m.id for m in client.models.list()]
    assert "smollm2:135m" in ids


def test_a_model_is_retrieved_by_its_id_and_an_unknown_one_is_a_404_naming_the_others(client):
    model = client.models.retrieve("smollm2:135m")
    assert (model.id, model.object, model.owned_by) == ("smollm2:135m", "model", "localinfer")
    for name in ("no-such-model", "hf.co/someone/x-GGUF:Q4_K_M"):  # a hub id holds slashes
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve(name)
        assert "smollm2:135m" in raised.value.message  # our answer, not a missing route


def test_chat_reply_usage_and_timings(client):
    reply = client.chat.completions.create(model="smollm2:135m", messages=QUESTION,
                                           temperature=0, max_tokens=12)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 10
    assert 1 <= reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    timings = reply.model_extra["timings"]  # our extra field rides along, the client keeps it
    assert 0 < timings["ttft_ms"] <= timings["e2el_ms"]


def test_max_tokens_ends_with_length(client):
    reply = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_completion_tokens=3,
                                           logit_bias=NO_END)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_streaming_is_incremental_and_matches_the_whole_reply(client, smollm2,
                                                             smollm2_reference):
    whole = client.chat.completions.create(model="smollm2:135m", messages=QUESTION,
                                           temperature=0, max_tokens=40)
    arrivals, pieces, usage, finish = [], [], None, None
    stream = client.chat.completions.create(
        model="smollm2:135m", messages=QUESTION, temperature=0, max_tokens=40, stream=True,
        stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                arrivals.append(time.monotonic())
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    # both are the greedy reply: the same text wherever the model's choice is clear (the
    # second request finds its prompt cached: another batch shape, near-ties may part)
    prompt = smollm2.tokenize(smollm2.apply_chat_template(QUESTION))
    assert smollm2_reference.follows(prompt, "".join(pieces), finish) > 5
    assert smollm2_reference.follows(prompt, whole.choices[0].message.content,
                                     whole.choices[0].finish_reason) > 5
    assert len(pieces) > 5
    assert arrivals[-1] - arrivals[0] > 0.01  # pieces came over time, not in one burst
    assert len(pieces) <= usage.completion_tokens <= 40  # a piece is one token or more
    assert (usage.completion_tokens == 40) == (finish == "length")


def test_cached_prompt_tokens_reported_on_repeat(client):
    messages = [{"role": "system", "content": "You are a terse assistant. " * 10}, *QUESTION]
    client.chat.completions.create(model="smollm2:135m", messages=messages, temperature=0,
                                   max_tokens=2)
    again = client.chat.completions.create(model="smollm2:135m", messages=messages,
                                           temperature=0, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens - 1


def test_json_schema_response_format_gives_matching_json(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model="smollm2:135m", temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    data = json.loads(reply.choices[0].message.content)
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)


def test_json_object_mode_gives_an_object(client):
    reply = client.chat.completions.create(
        model="smollm2:135m", temperature=0, max_tokens=100, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "What is the capital of France? Answer as JSON."}])
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_comes_back_as_tool_calls(client, stream):
    args = dict(model="smollm2:135m", temperature=0, max_tokens=40, tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                messages=[{"role": "user", "content": "What's the weather in Paris?"}])
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **args))
        calls = [c for ch in chunks for choice in ch.choices for c in choice.delta.tool_calls or []]
        finish = [choice.finish_reason for ch in chunks for choice in ch.choices
                  if choice.finish_reason]
        # the call's id and name come first, its arguments after in fragments, as OpenAI's
        assert calls[0].id and calls[0].function.name and {c.index for c in calls} == {0}
        name = calls[0].function.name
        arguments = "".join(c.function.arguments or "" for c in calls)
    else:
        reply = client.chat.completions.create(**args)
        calls = reply.choices[0].message.tool_calls
        finish = [reply.choices[0].finish_reason]
        name, arguments = calls[0].function.name, calls[0].function.arguments
    assert finish == ["tool_calls"]
    assert name == "get_weather"
    assert isinstance(json.loads(arguments)["city"], str)


NOTE = {"type": "function", "function": {
    "name": "write_note", "description": "Save a note",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}}
A_NOTE = [{"role": "user", "content": "Write a long note about the history of Paris."}]


def test_a_call_in_the_generic_shape_streams_and_ttft_is_when_its_name_went_out(client):
    """smollm2's template knows no tools: it is taught a generic JSON call, which was read
    only once the reply had ended — the call came as one chunk at the end, while `timings`
    gave the first sampled token's TTFT. Now its name goes out once it is known and its
    arguments follow in fragments, as the families' calls stream; TTFT is when the client was
    first shown something (backends/metrics.py): the name, some tokens after the first."""
    started, arrivals = time.monotonic(), []
    for chunk in client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=80, tools=[NOTE],
            tool_choice="required", messages=A_NOTE, stream=True):
        arrivals.append((time.monotonic() - started, chunk))
    calls = [(at, call) for at, chunk in arrivals for choice in chunk.choices
             for call in choice.delta.tool_calls or []]
    first_at, first = calls[0]
    assert first.function.name == "write_note" and first.id
    fragments = [call.function.arguments for _, call in calls[1:] if call.function.arguments]
    assert len(fragments) >= 10, fragments  # as the tokens come, not in one piece
    assert "".join(fragments).startswith("{") and '"text"' in "".join(fragments)
    timings = arrivals[-1][1].model_extra["timings"]
    decode_s = timings["predicted_ms"] / 1e3
    assert arrivals[-1][0] - first_at > decode_s / 2  # the name came long before the end
    # `{"name": "write_note", "arguments": {` is several tokens: TTFT counts to the last
    # of them, past the first token (the queue and the prompt's time) by a few tokens' time
    first_token_ms = timings["queue_ms"] + timings["prompt_ms"]
    assert timings["ttft_ms"] - first_token_ms >= 3 * timings["tpot_ms"], timings


def test_a_generic_call_cut_by_max_tokens_is_a_call_cut_short(client):
    """Cut by its length, the call came back as its raw JSON in `content`: it is the call
    as far as it got, as a family's call cut short is — with finish_reason "length", as
    OpenAI says it (the SDK's parse() raises on it; "tool_calls" had an agent run the tool
    on arguments that are not whole)."""
    for stream in (False, True):
        reply = client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=16, tools=[NOTE],
            tool_choice="required", messages=A_NOTE, stream=stream)
        if stream:
            chunks = list(reply)
            content = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
            calls = [call for ch in chunks for c in ch.choices for call in c.delta.tool_calls or []]
            finish = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
            name = calls[0].function.name
            arguments = "".join(call.function.arguments or "" for call in calls)
        else:
            message, finish = reply.choices[0].message, [reply.choices[0].finish_reason]
            content, name = message.content or "", message.tool_calls[0].function.name
            arguments = message.tool_calls[0].function.arguments
        assert not content and name == "write_note", (content, name)
        assert arguments.startswith("{") and '"text"' in arguments, arguments
        assert not arguments.rstrip().endswith("}"), arguments  # cut short
        assert finish == ["length"], stream


def test_tool_result_can_be_sent_back(client):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    reply = client.chat.completions.create(
        model="smollm2:135m", temperature=0, max_tokens=20, tools=[WEATHER], tool_choice="none",
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


def test_completions_and_a_batch_of_prompts(client, smollm2, smollm2_reference):
    prompts = ["The capital of France is", "One, two, three,"]
    one = client.completions.create(model="smollm2:135m", prompt=prompts[0],
                                    temperature=0, max_tokens=5)
    assert one.choices[0].text
    batch = client.completions.create(model="smollm2:135m", temperature=0, max_tokens=5,
                                      prompt=prompts)
    assert [c.index for c in batch.choices] == [0, 1]
    # each is the greedy continuation of its own prompt, alone or in a batch
    for prompt, choice in zip(prompts * 2, batch.choices + one.choices):
        assert smollm2_reference.follows(smollm2.tokenize(prompt), choice.text,
                                         choice.finish_reason) >= 2


def test_embeddings_are_unit_vectors_and_order_similarity(client):
    # the client asks for base64 unless told otherwise; check both encodings agree
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Stock markets fell."]
    result = client.embeddings.create(model="smollm2:135m", input=texts)
    floats = client.embeddings.create(model="smollm2:135m", input=texts[0],
                                      encoding_format="float")
    vectors = [d.embedding for d in result.data]
    assert len(vectors) == 3 and len(vectors[0]) == 576
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2])
    assert result.usage.prompt_tokens > 10
    short = client.embeddings.create(model="smollm2:135m", input=texts[0], dimensions=8,
                                     encoding_format="float").data[0].embedding
    norm = math.sqrt(sum(x * x for x in vectors[0][:8]))
    assert short == pytest.approx([x / norm for x in vectors[0][:8]], abs=1e-5)
    with pytest.raises(openai.BadRequestError, match="576"):
        client.embeddings.create(model="smollm2:135m", input="hi", dimensions=100_000)


def test_unknown_model_is_404_with_suggestion(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="smolm2", messages=QUESTION)
    assert "smollm2" in str(err.value)


def test_logprobs_are_the_models_own_for_each_written_token(client, smollm2, smollm2_path):
    """Each written token's log probability and the likeliest tokens', from the logits it was
    drawn from: greedy, the token is the likeliest; the figures are the model's own (a
    reference decode of the same prompt, up to the floats of another batch shape)."""
    reply = client.chat.completions.create(model="smollm2:135m", messages=QUESTION,
                                           max_tokens=6, temperature=0, logprobs=True,
                                           top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(e.token for e in content) == reply.choices[0].message.content
    for entry in content:
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 3 and top == sorted(top, reverse=True) and top[0] <= 0
        assert entry.token == entry.top_logprobs[0].token  # (greedy: the likeliest)
        assert entry.logprob == top[0] and bytes(entry.bytes).decode() == entry.token
        assert sum(math.exp(lp) for lp in top) <= 1 + 1e-6
    reference = Reference(smollm2_path)
    try:
        prompt = smollm2.tokenize(smollm2.apply_chat_template(QUESTION))
        logits = reference._decode(prompt)
    finally:
        reference.close()
    best = logits.max()
    first = best - (best + math.log(sum(math.exp(x - best) for x in logits.tolist())))
    # (another batch shape moves a logit by up to 0.43 here: tests/greedy.py; a figure
    # after temperature or penalties, or not normalised, is further off)
    assert content[0].logprob < 0 and abs(content[0].logprob - first) < 0.5
    streamed = list(client.chat.completions.create(
        model="smollm2:135m", messages=QUESTION, max_tokens=6, temperature=0, logprobs=True,
        stream=True))
    entries = [e for chunk in streamed if chunk.choices and chunk.choices[0].logprobs
               for e in chunk.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert entries and "".join(e.token for e in entries) == text
    assert all(e.top_logprobs == [] for e in entries)  # (none asked for)
    plain = client.chat.completions.create(model="smollm2:135m", messages=QUESTION,
                                           max_tokens=2, logprobs=False)
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="logprobs must be set to true"):
        client.chat.completions.create(model="smollm2:135m", messages=QUESTION, max_tokens=2,
                                       top_logprobs=2)


def test_completions_logprobs_in_the_legacy_shape(client):
    completion = client.completions.create(model="smollm2:135m", prompt="Once upon a time",
                                           max_tokens=5, temperature=0, logprobs=2, echo=False)
    choice = completion.choices[0]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) == len(logprobs.top_logprobs)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i])
                                    for i in range(len(logprobs.tokens))]
    assert all(len(top) <= 2 and max(top.values()) == lp
               for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs))


def test_fields_sent_as_null_are_as_if_unsent(client):
    """OpenAI's spec marks its fields nullable; a client writing its unset ones as null got a
    400 for each (temperature: Input should be a valid number)."""
    nulls = {"temperature": None, "top_p": None, "presence_penalty": None,
             "frequency_penalty": None, "n": None, "stop": None, "seed": None}
    reply = client.chat.completions.create(model="smollm2:135m", messages=QUESTION,
                                           max_tokens=3, extra_body=nulls)
    assert reply.choices[0].message.content
    text = client.completions.create(model="smollm2:135m", prompt="Paris is", max_tokens=3,
                                     extra_body=nulls)
    assert text.choices[0].text
    response = client.responses.create(model="smollm2:135m", input="Say hi.",
                                       max_output_tokens=16,
                                       extra_body={"temperature": None, "top_p": None})
    assert response.status in ("completed", "incomplete")
