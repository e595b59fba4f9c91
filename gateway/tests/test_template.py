"""Chat rendering: each turn's prompt tokens extend the previous turn's exactly."""

import pytest
from lightspeed import default_model, load_tokenizer
from lightspeed_gateway.openai.protocol import ChatMessage, Tool
from lightspeed_gateway.template import ChatRenderer, load_chat_template


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(load_tokenizer(default_model()))


def _conversation():
    return [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="List three colours."),
        ChatMessage(role="assistant", content="Red,green\n\nblue!"),
        ChatMessage(role="user", content=[{"type": "text", "text": "And"}, {"type": "text", "text": " two more?"}]),
        ChatMessage(role="assistant", content=" Cyan and  magenta. "),
        ChatMessage(role="user", content="Thanks."),
    ]


def test_every_turn_extends_the_previous(renderer):
    conversation = _conversation()
    previous = None
    for end in (2, 4, 6):
        prompt = renderer.render(conversation[:end])
        assert prompt.prefix_stable
        assert prompt.text.endswith("<|im_start|>assistant\n")
        if previous is not None:
            assert prompt.token_ids[: len(previous.token_ids)] == previous.token_ids
            assert prompt.text.startswith(previous.text)
        previous = prompt


def test_piecewise_tokens_decode_to_the_rendered_text(renderer):
    prompt = renderer.render(_conversation())
    assert renderer.tokenizer.decode(prompt.token_ids) == prompt.text


def test_tool_calls_and_results_keep_the_prefix(renderer):
    tools = [Tool(function={"name": "get_weather", "parameters": {"type": "object"}})]
    first = [ChatMessage(role="user", content="Weather in Oslo?")]
    call = ChatMessage(role="assistant", content=None, tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}])
    second = first + [call, ChatMessage(role="tool", tool_call_id="call_1", content="-3C")]
    a, b = renderer.render(first, tools=tools), renderer.render(second, tools=tools)
    assert a.prefix_stable and b.prefix_stable
    assert b.token_ids[: len(a.token_ids)] == a.token_ids
    assert "get_weather" in a.text  # the tool list reached the prompt (SmolLM2's template has no tools)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in b.text


def test_template_override_and_no_generation_prompt(renderer, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}[assistant]{% endif %}")
    custom = ChatRenderer(renderer.tokenizer, load_chat_template(str(path)))
    prompt = custom.render([ChatMessage(role="user", content="hi")], add_generation_prompt=False)
    assert prompt.text == "[user]hi\n"
    assert custom.render([ChatMessage(role="user", content="hi")]).text == "[user]hi\n[assistant]"
