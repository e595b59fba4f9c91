"""A generated answer sent back as the next turn's assistant message keeps its generated token ids,
so the prefix cache matches through it (template.py, render_cache.AnswerTokens)."""

import json

import pytest
from gateway_fake_engine import FakeAsyncLLM
from lightspeed import default_model, load_tokenizer
from lightspeed_gateway.config import ServerConfig
from lightspeed_gateway.openai.protocol import ChatMessage
from lightspeed_gateway.render_cache import AnswerTokens
from lightspeed_gateway.server.app import build_app
from lightspeed_gateway.template import ChatRenderer
from starlette.testclient import TestClient

ANSWER = "Hello world, hello again"
MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_model())


def spelled(tokenizer, text: str) -> list[int]:
    """One token per character: ids that re-tokenising `text` does not give back."""
    return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]


def turn_two(answer: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content="Say it"), ChatMessage(role="assistant", content=answer),
            ChatMessage(role="user", content="Once more")]


def test_remembered_answer_is_spliced_and_decodes_to_the_text(tokenizer):
    renderer = ChatRenderer(tokenizer)
    first = renderer.render(turn_two(ANSWER)[:1])
    generated = spelled(tokenizer, ANSWER)
    assert generated != renderer.encode_batch([ANSWER])[0]
    before = renderer.render(turn_two(ANSWER))
    assert before.generated_answers == 0
    assert renderer.remember_answer(ANSWER, [*generated, tokenizer.eos_token_id])  # the EOS is dropped
    second = ChatRenderer(tokenizer)
    second.answers = renderer.answers  # a fresh render cache: the splice, not a remembered boundary
    after = second.render(turn_two(ANSWER))
    assert after.prefix_stable and after.generated_answers == 1
    n = len(first.token_ids)
    assert after.token_ids[:n] == first.token_ids
    assert after.token_ids[n : n + len(generated)] == generated
    assert tokenizer.decode(after.token_ids) == after.text == before.text
    assert len(after.token_ids) == len(before.token_ids) - len(renderer.encode_batch([ANSWER])[0]) + len(generated)


def test_ids_that_do_not_decode_to_the_text_are_not_remembered(tokenizer):
    renderer = ChatRenderer(tokenizer)
    ids = spelled(tokenizer, ANSWER)
    assert not renderer.remember_answer(ANSWER[:-3], ids)  # a stop string cut the text, not the ids
    assert not renderer.remember_answer("", ids) and not renderer.remember_answer(ANSWER, [])
    assert len(renderer.answers) == 0
    assert renderer.render(turn_two(ANSWER[:-3])).generated_answers == 0


def test_answer_memory_is_bounded_and_can_be_off(tokenizer):
    memory = AnswerTokens(max_tokens=10)
    memory.put("a", list(range(6)))
    memory.put("b", list(range(6)))  # 12 > 10: "a", the least recent, goes
    assert memory.get("a") is None and list(memory.get("b")) == list(range(6)) and memory.num_tokens == 6
    memory.put("c", list(range(11)))  # larger than the bound: not kept
    assert memory.get("c") is None
    off = ChatRenderer(tokenizer, answer_tokens=0)
    off.remember_answer_soon(ANSWER, spelled(tokenizer, ANSWER))
    assert len(off.answers) == 0


@pytest.fixture(scope="module")
def http():
    app = build_app(ServerConfig(reasoning_parser="think"),
                    lambda: FakeAsyncLLM(default_model(), token_delay_s=0), model_path=default_model())
    with TestClient(app) as client:
        yield client


def tokenize(http, messages: list[dict]) -> list[int]:
    response = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def chat(http, content: str, stream: bool, **extra) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 64, "stream": stream,
            **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()["choices"][0]["message"]["content"]
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


@pytest.mark.parametrize("stream", [False, True])
def test_served_answer_comes_back_in_its_generated_ids(http, tokenizer, stream):
    text = f"{ANSWER} {'streamed' if stream else 'whole'}"
    question = f"SPELL:{text}"
    assert chat(http, question, stream) == text
    first = tokenize(http, [{"role": "user", "content": question}])
    second = tokenize(http, [{"role": "user", "content": question}, {"role": "assistant", "content": text},
                             {"role": "user", "content": "Once more"}])
    generated = spelled(tokenizer, text)
    assert second[: len(first)] == first
    assert second[len(first) : len(first) + len(generated)] == generated


def test_served_answers_cut_by_a_stop_string_or_with_reasoning_are_tokenised_afresh(http, tokenizer):
    cut = chat(http, f"SPELL:{ANSWER}! more", False, stop=["!"])  # the fake cuts one-token stops exactly
    assert cut == ANSWER
    reasoned = chat(http, f"SPELL:<think>hmm</think>{ANSWER} reasoned", False)
    assert reasoned == f"{ANSWER} reasoned"
    for question, text in ((f"SPELL:{ANSWER}! more", cut), (f"SPELL:<think>hmm</think>{ANSWER} reasoned", reasoned)):
        second = tokenize(http, [{"role": "user", "content": question}, {"role": "assistant", "content": text},
                                 {"role": "user", "content": "Once more"}])
        answer_ids = tokenizer.encode(text, add_special_tokens=False)
        assert any(second[i : i + len(answer_ids)] == answer_ids for i in range(len(second)))


def test_anthropic_answer_comes_back_in_its_generated_ids(http, tokenizer):
    text = f"{ANSWER} anthropic"
    question = f"SPELL:{text}"
    response = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 64,
                                               "messages": [{"role": "user", "content": question}]})
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": text}]
    first = tokenize(http, [{"role": "user", "content": question}])
    second = tokenize(http, [{"role": "user", "content": question}, {"role": "assistant", "content": text},
                             {"role": "user", "content": "Once more"}])
    generated = spelled(tokenizer, text)
    assert second[len(first) : len(first) + len(generated)] == generated


def test_metrics_count_remembered_refused_and_spliced_answers(http):
    # after the tests above: three answers remembered (whole, streamed, Anthropic), the stop-cut one
    # refused, and each remembered one spliced into a /tokenize render at least once
    text = http.get("/metrics").text
    counts = {}
    for line in text.splitlines():
        if line.startswith("lightspeed:answer_cache_answers_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    assert counts["remembered"] >= 3 and counts["refused"] >= 1 and counts["spliced"] >= 3, counts


def test_answer_cache_flag_reaches_the_renderer():
    app = build_app(ServerConfig(answer_cache_tokens=0), lambda: FakeAsyncLLM(default_model(), token_delay_s=0),
                    model_path=default_model())
    with TestClient(app) as client:
        question = f"SPELL:{ANSWER} off"
        body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 64}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        second = tokenize(client, [{"role": "user", "content": question},
                                   {"role": "assistant", "content": f"{ANSWER} off"}])
        assert not any(second[i : i + 3] == spelled(load_tokenizer(default_model()), ANSWER)[:3]
                       for i in range(len(second)))
    with pytest.raises(ValueError, match="answer_cache_tokens"):
        ServerConfig(answer_cache_tokens=-1)
