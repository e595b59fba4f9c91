"""MLABackend.kernel prepares the chosen MLA decode kernel (a JIT build, a library import) before the
first step, and a kernel that cannot be prepared gives way to the next one in rank, unless an override
named it."""

import logging

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed.layers import mla as mla_layers


class Kernel:
    def __init__(self, name: str, fails: bool):
        self.name, self.fails, self.prepared = name, fails, 0

    def __call__(self, *args, **kwargs):
        return self.name

    def prepare(self):
        self.prepared += 1
        if self.fails:
            raise RuntimeError(f"{self.name}: nvcc failed")


def _backend(monkeypatch, fails: dict[str, bool]):
    reg = lk.KernelRegistry(load_plugins=None)
    kernels = {}
    for rank, (name, fail) in enumerate(fails.items()):
        kernels[name] = lk.register_kernel("mla", "decode", name=name, solution="test", priority=10 - rank,
                                           registry=reg)(Kernel(name, fail))
    monkeypatch.setattr(mla_layers, "select_kernel", reg.select)
    monkeypatch.setattr(mla_layers, "explain", reg.explain)
    return mla_layers.MLABackend(num_heads=16, softmax_scale=0.1), kernels


def _pick(backend):
    return backend.kernel("decode", torch.bfloat16, torch.device("cpu"), page_size=64)


def test_the_best_kernel_is_prepared_once(monkeypatch):
    backend, kernels = _backend(monkeypatch, {"fast": False, "slow": False})
    assert _pick(backend) is kernels["fast"] and _pick(backend) is kernels["fast"]
    assert kernels["fast"].prepared == 1 and kernels["slow"].prepared == 0


def test_a_kernel_that_cannot_be_prepared_gives_way_with_a_warning(monkeypatch, caplog):
    backend, kernels = _backend(monkeypatch, {"fast": True, "middle": True, "slow": False})
    with caplog.at_level(logging.WARNING, logger="lightspeed.mla"):
        assert _pick(backend) is kernels["slow"]
    assert "fast cannot run here" in caplog.text and "nvcc failed" in caplog.text


def test_when_none_can_be_prepared_the_last_error_is_raised(monkeypatch):
    backend, _ = _backend(monkeypatch, {"fast": True, "slow": True})
    with pytest.raises(RuntimeError, match="slow: nvcc failed"):
        _pick(backend)


def test_an_override_gets_its_own_error(monkeypatch):
    backend, kernels = _backend(monkeypatch, {"fast": False, "broken": True})
    with lk.override(**{"mla/decode": "broken"}), pytest.raises(RuntimeError, match="broken: nvcc failed"):
        _pick(backend)
    assert kernels["fast"].prepared == 0
