"""ModelRunner's result copies (runner/model_runner.py, ResultCopies) and the variable that picks their stream."""

import pytest
import torch
from lightspeed import envs
from lightspeed.runner.model_runner import ResultCopies


def test_on_cpu_the_results_are_the_host_tensors_and_there_is_no_event():
    tokens, ranks = torch.tensor([3, 1, 4], dtype=torch.int32), torch.tensor([1, 2, 1])
    host, ready = ResultCopies(torch.device("cpu")).copy([tokens, ranks])
    assert ready is None and host[0] is tokens and host[1] is ranks


@pytest.mark.parametrize("raw,want", [("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False),
                                      ("", True), (None, True)])
def test_result_copy_stream_variable(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("LIGHTSPEED_RESULT_COPY_STREAM", raising=False)
    else:
        monkeypatch.setenv("LIGHTSPEED_RESULT_COPY_STREAM", raw)
    assert envs.load_envs().result_copy_stream is want


def test_a_bad_boolean_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_RESULT_COPY_STREAM", "maybe")
    with pytest.raises(ValueError, match="LIGHTSPEED_RESULT_COPY_STREAM='maybe' is not a boolean"):
        envs.load_envs()


@pytest.mark.gpu
@pytest.mark.parametrize("own_stream", [True, False])
def test_gpu_copies_land_by_the_event_and_survive_the_allocator(own_stream):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    copies = ResultCopies(torch.device("cuda"), own_stream=own_stream)
    assert (copies.stream is not None) == own_stream
    # A long device->host copy on another stream holds the copy engine, as the KV write-through does.
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(big.shape, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        pinned.copy_(big, non_blocking=True)
    wanted = []
    for step in range(8):
        tokens = torch.arange(64, device="cuda", dtype=torch.int64) * (step + 1)
        host, ready = copies.copy([tokens.to(torch.int32, copy=True), tokens.float()])
        del tokens  # the source's memory is free for the next step's tensors; the copy must still read it
        torch.empty(64, dtype=torch.int64, device="cuda").fill_(-1)
        wanted.append((host, ready, step))
    for host, ready, step in wanted:
        ready.synchronize()
        expect = torch.arange(64) * (step + 1)
        assert torch.equal(host[0], expect.to(torch.int32)) and torch.equal(host[1], expect.float())
    side.synchronize()


def test_to_host_on_cpu_is_the_tensor_itself():
    verdict = torch.tensor([[1, 0], [1, 1]])
    assert ResultCopies(torch.device("cpu")).to_host(verdict) is verdict
