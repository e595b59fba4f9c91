import pytest
from lightspeed import RequestOutputKind, SamplingParams, StructuredOutputParams


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.2}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"n": 0}, "n must"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"logprobs": -1}, "logprobs"),
    ({"stop": ["ok", ""]}, "stop strings"),
    ({"logit_bias": {5: 200.0}}, "logit_bias"),
    ({"stop_token_ids": [-4]}, "stop_token_ids"),
    ({"top_k": 15716214824}, "top_k"),  # once crashed the core: top_k lives in an int32 tensor
    ({"seed": 2**63}, "seed"),           # seeds live in int64; seed + i for n > 1 must not overflow
    ({"seed": -1}, "seed"),
])
def test_invalid_params_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_normalisation():
    p = SamplingParams(stop="END", logit_bias={"7": 1}, top_k=-1)
    assert p.stop == ["END"] and p.logit_bias == {7: 1.0} and p.top_k == -1
    assert p.output_kind is RequestOutputKind.CUMULATIVE
    assert SamplingParams(temperature=0).greedy


def test_structured_output_params():
    s = StructuredOutputParams(json_schema={"type": "object"})
    assert s.kind_and_spec() == ("json_schema", '{"type": "object"}')
    assert StructuredOutputParams(regex="[a-z]+").kind_and_spec() == ("regex", "[a-z]+")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputParams(json_object=True, regex="x")
    with pytest.raises(ValueError, match="not valid JSON"):
        StructuredOutputParams(json_schema="{nope")
    p = SamplingParams(structured_output={"json_object": True})
    assert p.structured_output.kind_and_spec() == ("json_object", "")
