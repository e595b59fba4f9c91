"""A step's transfers between host and GPU (runner/step_io.py) and the variable that picks how they move."""

import logging

import pytest
import torch
from lightspeed import envs
from lightspeed.runner import step_io
from lightspeed.runner.step_io import PacketUploads, PinnedInUse, ResultCopies, resolve_step_io


def test_on_cpu_the_results_are_the_host_tensors_and_there_is_no_event():
    tokens, ranks = torch.tensor([3, 1, 4], dtype=torch.int32), torch.tensor([1, 2, 1])
    copies = ResultCopies(torch.device("cpu"), "kernel")
    host, ready = copies.copy([tokens, ranks])
    assert copies.mode == "compute" and ready is None and host[0] is tokens and host[1] is ranks


def test_to_host_and_upload_on_cpu_are_the_tensor_itself():
    verdict = torch.tensor([[1, 0], [1, 1]])
    assert ResultCopies(torch.device("cpu")).to_host(verdict) is verdict
    packet = torch.arange(8, dtype=torch.int32)
    assert PacketUploads(torch.device("cpu"), "kernel").upload(packet) is packet


def test_a_bad_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_STEP_IO", "dma")
    with pytest.raises(ValueError, match="LIGHTSPEED_STEP_IO='dma' is not one of kernel, stream, compute"):
        envs.load_envs()
    with pytest.raises(ValueError, match="choose one of kernel, stream, compute"):
        resolve_step_io(torch.device("cpu"), "dma")


def test_kernel_transfers_that_fail_their_probe_fall_back_to_the_copy_stream(monkeypatch, caplog):
    monkeypatch.setattr(step_io, "kernel_transfer_problem", lambda device: "no mapped memory here")
    with caplog.at_level(logging.WARNING, logger="lightspeed.runner"):
        assert resolve_step_io(torch.device("cuda"), "kernel") == "stream"
    assert "no mapped memory here" in caplog.text
    assert resolve_step_io(torch.device("cuda"), "compute") == "compute"  # other modes are not probed


@pytest.mark.gpu
def test_gpu_kernel_transfers_pass_their_probe():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert step_io.kernel_transfer_problem(torch.device("cuda")) is None


def _steps(copies: ResultCopies, count: int) -> list:
    """`count` steps' results through `copies`; each step's source tensors are freed (and their memory reused)
    before its copies have run."""
    launched = []
    for step in range(count):
        tokens = torch.arange(64, device="cuda", dtype=torch.int64) * (step + 1)
        verdict = copies.to_host(tokens[:4] % 3 == 0)
        host, ready = copies.copy([tokens.to(torch.int32, copy=True), tokens.float()])
        del tokens
        torch.empty(64, dtype=torch.int64, device="cuda").fill_(-1)
        launched.append((host, verdict, ready, step))
    return launched


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["kernel", "stream", "compute"])
def test_gpu_results_land_by_the_event_and_survive_the_allocator(mode):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    copies = ResultCopies(torch.device("cuda"), mode)
    assert copies.mode == mode and (copies.stream is not None) == (mode == "stream")
    # Kernels built and pinned blocks cached first, as in a serving engine's steady state: a build or a new
    # pinned block (cudaHostAlloc waits for the device) would take longer than the big copy below.
    _steps(copies, 8)[-1][2].synchronize()
    # A long device->host copy on another stream holds the copy engine, as the KV write-through does.
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(big.shape, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(big, non_blocking=True)
    side_done = side.record_event()
    launched = _steps(copies, 8)
    launched[-1][2].synchronize()
    if mode == "kernel":  # its transfers waited for no copy engine: the big copy is still running
        assert not side_done.query()
    for host, verdict, ready, step in launched:
        ready.synchronize()
        expect = torch.arange(64) * (step + 1)
        assert torch.equal(host[0], expect.to(torch.int32)) and torch.equal(host[1], expect.float())
        assert torch.equal(verdict, expect[:4] % 3 == 0)
    side.synchronize()
    if mode == "kernel":  # host tensors are held only until their event has fired
        copies.copy([torch.zeros(1, device="cuda")])
        assert len(copies.writing) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["kernel", "stream", "compute"])
def test_gpu_a_step_that_samples_nothing_has_empty_results(mode):
    """A step of prefill chunks that completes no prompt samples no token: its results have zero elements (in
    `kernel` mode their pinned host side has no storage; served, this once failed such steps' requests)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    copies = ResultCopies(torch.device("cuda"), mode)
    host, ready = copies.copy([torch.empty(0, dtype=torch.int32, device="cuda"), torch.empty(0, 5, device="cuda")])
    ready.synchronize()
    assert [tuple(h.shape) for h in host] == [(0,), (0, 5)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["kernel", "stream"])
def test_gpu_packet_upload_equals_the_host_words(mode):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    uploads = PacketUploads(torch.device("cuda"), mode)
    host = torch.arange(-5000, 5000, dtype=torch.int32).pin_memory()
    dev = uploads.upload(host)
    assert dev.is_cuda and torch.equal(dev.cpu(), host)
    if mode == "kernel":  # the host words are held until their read has run, and no longer
        uploads.upload(host[:8])
        assert len(uploads.reading) == 1


class _Event:
    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


def test_pinned_in_use_releases_only_the_leading_landed_holds():
    """Events fire in stream order: a landed one behind one still running waits its turn."""
    held, events = PinnedInUse(), [_Event(True), _Event(False), _Event(True)]
    for i, e in enumerate(events):
        held.hold(e, [i])
    held.release_done()
    assert len(held) == 2
    events[1].done = True
    held.release_done()
    assert len(held) == 0
