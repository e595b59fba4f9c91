"""`lightspeed serve FOLDER` on a DeepSeek-V3-format folder: a tiny random `DeepseekV3ForCausalLM`
saved by transformers (config.json + safetensors) with SmolLM2's tokenizer beside it. Chat,
streaming, tool calls and structured output work as on the Llama path (MLA pool, mla/* kernels,
DeepSeekMoE); `--quantization fp8 --kv-cache-dtype fp8` serves the same folder in FP8."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from gateway_testing import ENGINE_KIND, start_server, stop_cleanly

pytestmark = pytest.mark.skipif(ENGINE_KIND != "real", reason="serves a real DeepSeek-V3 folder")

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False}}}
# A random model keeps choosing the whitespace JSON allows inside objects; a root enum has none.
SCHEMA = {"type": "string", "enum": ["Paris", "Oslo"]}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def deepseek_folder(tmp_path_factory):
    import torch
    from lightspeed import default_model, load_tokenizer
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    try:
        tokenizer = load_tokenizer(default_model())
    except RuntimeError as e:
        pytest.skip(str(e))
    config = DeepseekV3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, moe_intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=32,
        qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32, max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("deepseek-v3-tiny")
    DeepseekV3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["bf16", "fp8"])
def served(request, deepseek_folder):
    extra = ["--quantization", "fp8", "--kv-cache-dtype", "fp8"] if request.param == "fp8" else []
    proc = start_server([str(deepseek_folder), *extra])
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield client, client.models.list().data[0].id, proc
    stop_cleanly(proc)


def test_chat_and_streaming(served):
    client, model, proc = served
    assert model.startswith("deepseek-v3-tiny")
    whole = client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=10)
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=10,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert "MLALayout(" in proc.output()  # the engine built the latent (MLA) KV pool


def test_tool_call_and_structured_output(served):
    client, model, _ = served
    named = client.chat.completions.create(model=model, messages=ASK, tools=[TOOL], max_tokens=40, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and named.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])
    text = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Which city?"}], max_tokens=30, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}},
    ).choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
