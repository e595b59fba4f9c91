"""Repo-wide pytest policy: GPU tests skip without CUDA, slow tests need --runslow."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--runslow") or "slow" in (config.getoption("-m") or "")
    has_cuda = None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: pass --runslow"))
        if "gpu" in item.keywords:
            if has_cuda is None:
                has_cuda = _has_cuda()
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
