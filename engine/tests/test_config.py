import dataclasses

import pytest
from lightspeed.config import EngineConfig, engine_arg_specs, parse_bytes


def test_parse_bytes_units():
    assert parse_bytes("2GiB") == 2 * 1024**3
    assert parse_bytes("512MB") == 512 * 1000**2
    assert parse_bytes("1.5KiB") == 1536
    assert parse_bytes(1024) == 1024
    for bad in ("lots", "2XB", "", True):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_from_cli_converts_strings_and_is_frozen():
    c = EngineConfig.from_cli(kv_cache_memory="64MiB", max_num_seqs="8", enable_prefix_cache="false",
                              gpu_memory_utilization="0.5", max_model_len=None)
    assert c.kv_cache_memory == 64 << 20 and c.max_num_seqs == 8 and c.enable_prefix_cache is False
    assert c.gpu_memory_utilization == 0.5 and c.max_model_len is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_num_seqs = 4
    with pytest.raises(ValueError, match="unknown engine argument"):
        EngineConfig.from_cli(nonsense="1")


@pytest.mark.parametrize("kwargs, match", [
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"page_size": 12}, "power of two"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
    ({"policy": "random"}, "policy"),
    ({"device": "tpu"}, "device"),
    ({"dtype": "int8"}, "dtype"),
    ({"max_model_len": -3}, "max_model_len"),
    ({"kv_cache_memory": "0B"}, "kv_cache_memory"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"data_parallel_size": 2, "data_parallel_rank": 2}, "data_parallel_rank"),
    ({"expert_parallel_size": 2}, "needs enable_expert_parallel"),
    ({"enable_expert_parallel": True, "tensor_parallel_size": 2, "data_parallel_size": 2,
      "expert_parallel_size": 8}, "expert_parallel_size=8 must be"),
    ({"nnodes": 2, "node_rank": 2}, "node_rank"),
    ({"tensor_parallel_size": 2, "device": "cuda:1"}, "its own GPU"),
    ({"tensor_parallel_size": 2, "disk_cache_dir": "/tmp/kv"}, "disk KV tier"),
    ({"quantization": "int3"}, "quantization=.int3. is not one of auto, none, fp8, int8, int4, gguf"),
    ({"session_retention": 17}, "session_retention"),
])
def test_validation_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_every_field_has_cli_help():
    specs = engine_arg_specs()
    assert [s.name for s in specs] == [f.name for f in dataclasses.fields(EngineConfig)]
    for s in specs:
        assert s.help and s.flag == "--" + s.name.replace("_", "-")
    by_name = {s.name: s for s in specs}
    assert "fp8" in by_name["kv_cache_dtype"].choices
    assert by_name["max_num_seqs"].default == 256


def test_expert_parallel_ranks():
    assert EngineConfig(tensor_parallel_size=2).expert_parallel_ranks == 1
    both = EngineConfig(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True)
    assert both.expert_parallel_ranks == 4
    assert both.replace(expert_parallel_size=2).expert_parallel_ranks == 2


def test_weight_only_quantisation_is_one_rank_only():
    import torch
    from lightspeed.runner.factory import resolve_quantization

    assert resolve_quantization("auto", torch.device("cpu"), "gguf", None, parallel=True) == "none"
    with pytest.raises(ValueError, match="several tensor/expert-parallel ranks"):
        resolve_quantization("int8", torch.device("cpu"), "auto", None, parallel=True)


def test_default_host_tier_is_twice_the_device_pool_within_a_share_of_free_ram():
    import torch
    from lightspeed.runner.factory import default_host_cache_bytes

    cuda, gib = torch.device("cuda"), 1 << 30
    # An 80 GB card's ~60 GB pool on a host with 120 GiB free: a quarter stays free, the rest is the cap.
    assert default_host_cache_bytes(cuda, 60 * gib, available=120 * gib) == 90 * gib
    assert default_host_cache_bytes(cuda, 20 * gib, available=120 * gib) == 40 * gib  # 2x the pool
    # Eight ranks on the host share the 90 GiB: each pins an eighth, not the same 90.
    assert default_host_cache_bytes(cuda, 60 * gib, ranks_on_host=8, available=120 * gib) == 90 * gib // 8
    # A small host keeps at least 8 GiB unpinned; one with less than that gets no default host tier.
    assert default_host_cache_bytes(cuda, 60 * gib, available=16 * gib) == 8 * gib
    assert default_host_cache_bytes(cuda, 60 * gib, available=6 * gib) == 0
    assert default_host_cache_bytes(torch.device("cpu"), 60 * gib, available=120 * gib) == 256 << 20


def test_engine_ranks_per_node_counts_every_data_parallel_core():
    from lightspeed.distributed.topology import engine_ranks_per_node

    assert engine_ranks_per_node(EngineConfig()) == 1
    assert engine_ranks_per_node(EngineConfig(tensor_parallel_size=4, data_parallel_size=2)) == 8
    assert engine_ranks_per_node(EngineConfig(tensor_parallel_size=8, nnodes=2, master_port=29500)) == 4
