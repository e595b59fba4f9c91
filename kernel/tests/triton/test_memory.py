"""memory/host_copy: the Triton kernel moves exactly the bytes, in both directions, and on a GPU waits for no
other stream's copies (kernel/lightspeed_kernel/triton/memory.py)."""

import pytest
import torch
from lightspeed_kernel import ops
from lightspeed_kernel.triton import memory

DTYPES = [torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.bool, torch.uint8]


def _values(n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, (n,), generator=g).to(dtype)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if torch.cuda.is_available() else t.clone()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 64, 1025, 3 * memory.BLOCK + 5])  # one word, odd sizes, several programs
def test_device_to_host_and_back_moves_exactly_the_bytes(device, dtype, n):
    src = _values(n, dtype).to(device)
    host = _host(torch.zeros(n, dtype=dtype))
    memory.host_copy(ops.memory.as_bytes(src), ops.memory.as_bytes(host))
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(host, src.cpu())
    back = torch.zeros(n, dtype=dtype, device=device)
    memory.host_copy(ops.memory.as_bytes(host), ops.memory.as_bytes(back))
    assert torch.equal(back.cpu(), src.cpu())


class _KernelSpy:
    """Stands in for memory._copy_kernel: records the element type of each launch, then launches the real one."""

    def __init__(self, real):
        self.real, self.dtypes = real, []

    def __getitem__(self, grid):
        def launch(src, dst, *args, **kwargs):
            self.dtypes.append(src.dtype)
            return self.real[grid](src, dst, *args, **kwargs)
        return launch


@pytest.mark.parametrize("offset,size,path", [(0, 40, torch.int32), (1, 40, torch.uint8), (2, 40, torch.uint8),
                                              (3, 40, torch.uint8), (0, 39, torch.uint8)])
def test_unaligned_views_and_odd_sizes_take_the_byte_path(device, monkeypatch, offset, size, path):
    """A view that starts off a 4-byte boundary, or a size that is not whole words, cannot be read as words."""
    spy = _KernelSpy(memory._copy_kernel)
    monkeypatch.setattr(memory, "_copy_kernel", spy)
    src = torch.arange(64, dtype=torch.uint8, device=device)[offset:offset + size]
    host = _host(torch.zeros(48, dtype=torch.uint8))[offset:offset + size]
    memory.host_copy(src, host)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(host, src.cpu()) and spy.dtypes == [path]


def test_the_op_checks_its_arguments():
    a = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="differ"):
        ops.host_copy(a, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="differ"):
        ops.host_copy(a, torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        ops.host_copy(torch.zeros(4, 2, dtype=torch.int32)[:, 0], a)
    ops.host_copy(torch.zeros(0), torch.zeros(0))  # nothing to move is fine


@pytest.mark.gpu
def test_pageable_host_memory_is_a_clear_error():
    with pytest.raises(ValueError, match="must be pinned"):
        ops.host_copy(torch.zeros(4, device="cuda"), torch.zeros(4))


@pytest.mark.gpu
def test_an_empty_pinned_tensor_is_not_mistaken_for_pageable_memory():
    """torch gives a zero-element pinned tensor no storage, so it reports is_pinned() False; a step with no
    rows of some result (no logprobs asked for) once failed its requests on this in `kernel` step IO."""
    empty = torch.empty(0, dtype=torch.int64, pin_memory=True)
    ops.host_copy(torch.empty(0, dtype=torch.int64, device="cuda"), empty)
    ops.host_copy(empty, torch.empty(0, dtype=torch.int64, device="cuda"))


def test_the_op_on_cpu_copies_through_the_reference():
    src, dst = torch.tensor([[1.5, -2.0], [3.0, 4.25]]), torch.zeros(2, 2)
    ops.host_copy(src, dst)
    assert torch.equal(dst, src)


@pytest.mark.gpu
def test_gpu_op_picks_the_kernel_and_waits_for_no_other_streams_copy():
    """A 1 GiB device->host copy on another stream holds the copy engine for tens of milliseconds; the
    kernel's transfer on the current stream lands while it still runs (a copy-engine copy would queue)."""
    from lightspeed_kernel.registry.select import REGISTRY

    tokens = torch.arange(64, device="cuda", dtype=torch.int32)
    assert REGISTRY.impl_for("memory", "host_copy", ops.memory.as_bytes(tokens)) is memory.host_copy
    # Everything allocated and built first: a kernel build, or a new pinned block (cudaHostAlloc waits for the
    # device), would take longer than the big copy.
    host = torch.zeros(64, dtype=torch.int32, pin_memory=True)
    ops.host_copy(tokens, host)
    torch.cuda.synchronize()
    host.zero_()
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(big.shape, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(big, non_blocking=True)
    side_done = side.record_event()
    ops.host_copy(tokens, host)
    ready = torch.cuda.current_stream().record_event()
    ready.synchronize()
    assert not side_done.query(), "the big copy finished first: the test proves nothing on this machine"
    assert torch.equal(host, tokens.cpu())
    side_done.synchronize()
