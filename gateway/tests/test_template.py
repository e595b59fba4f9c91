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


class CountingTokenizer:
    """The real tokenizer, counting template renders and tokenised characters."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.chat_template = tokenizer.chat_template
        self.backend_tokenizer = self
        self.renders = 0
        self.encoded_chars = 0

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self._tokenizer.apply_chat_template(*args, **kwargs)

    def encode_batch(self, texts, add_special_tokens):
        self.encoded_chars += sum(len(t) for t in texts)
        return self._tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)

    def reset(self):
        self.renders = self.encoded_chars = 0


def _long_session(turns):
    messages = [ChatMessage(role="system", content="You are a coding agent. " * 20)]
    for i in range(turns):
        messages.append(ChatMessage(role="user", content=f"Step {i}: fix the bug in module_{i}.py " * 5))
        messages.append(ChatMessage(role="assistant", content=f"Done with step {i}; tests pass. " * 8))
    return messages


def test_warm_turns_render_only_new_messages(renderer):
    counting = CountingTokenizer(renderer.tokenizer)
    warm = ChatRenderer(counting)
    cold = ChatRenderer(renderer.tokenizer, cache_tokens=0)
    session = _long_session(30)
    costs = []
    for end in range(2, len(session), 2):  # each turn: the history so far plus one new user message
        counting.reset()
        prompt = warm.render(session[:end])
        assert prompt.token_ids == cold.render(session[:end]).token_ids  # same tokens as from scratch
        assert prompt.reused_messages == (end - 2 if end > 2 else 0)
        costs.append((counting.renders, counting.encoded_chars))
    # O(new messages): the same number of template calls and about the same tokenised text every
    # turn, however long the conversation (a cold render of turn 30 makes 60 template calls).
    assert max(renders for renders, _ in costs[1:]) <= 4
    assert max(chars for _, chars in costs[1:]) < 2 * min(chars for _, chars in costs[1:])
    assert len(warm.cache) == 1  # each turn's entry superseded the previous one of the conversation


def test_render_cache_is_bounded_and_a_changed_history_starts_over(renderer):
    small = ChatRenderer(renderer.tokenizer, cache_tokens=1500)
    for i in range(5):
        small.render([ChatMessage(role="user", content=f"conversation {i} " * 100)])
    assert 0 < small.cache.num_tokens <= 1500 and len(small.cache) < 5
    session = _long_session(3)
    small.render(session[:4])
    assert small.render(session[:6]).reused_messages == 4
    edited = [session[0], ChatMessage(role="user", content="A different first question."), *session[2:6]]
    prompt = small.render(edited)
    assert prompt.reused_messages == 0  # the history changed before any remembered boundary
    assert prompt.token_ids == ChatRenderer(renderer.tokenizer, cache_tokens=0).render(edited).token_ids


def test_render_async_runs_in_a_worker_thread(renderer):
    import asyncio
    import threading

    seen = []
    counting = CountingTokenizer(renderer.tokenizer)
    original = counting.apply_chat_template
    counting.apply_chat_template = lambda *a, **k: (seen.append(threading.current_thread().name), original(*a, **k))[1]
    async_renderer = ChatRenderer(counting)
    prompt = asyncio.run(async_renderer.render_async(_conversation()))
    assert prompt.token_ids == renderer.render(_conversation()).token_ids
    assert seen and all(name.startswith("render") for name in seen)
    async_renderer.close()
