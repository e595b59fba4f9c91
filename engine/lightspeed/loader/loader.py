"""`load_model`: resolve files → `ModelConfig` → build the model on its device → fill its weights."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from pathlib import Path

import torch
from torch import nn

from ..layers import ParallelContext, ParallelLayout
from ..layers.quantization import convert_to_fp8, quantize_to_fp8
from ..layers.weight_only import WEIGHT_SCHEMES, SourceFormat, named_weights, plan_formats, quantize_weights
from ..models import ModelConfig, build_model, preset_config
from ..models.config_deepseek import QuantizationConfig
from ..models.weights import LLAMA_STACKED_PARAMS, target_of
from .files import ModelFiles, find_gguf, resolve_model_files
from .gguf_weights import gguf_hf_config, gguf_tensor_formats, iterate_gguf_weights, open_gguf
from .safetensors_weights import iterate_safetensors


def load_hf_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of a HF directory / config.json, or of a GGUF file (or directory with one)."""
    path = Path(path).expanduser()
    gguf = find_gguf(path) if path.exists() else None
    if gguf is not None and not (path.is_dir() and (path / "config.json").is_file()):
        return ModelConfig.from_hf_dict(gguf_hf_config(open_gguf(gguf), gguf), name=str(gguf))
    return ModelConfig.from_pretrained(path)


def read_model_config(model: str | Path | None, load_format: str = "auto") -> ModelConfig:
    """The `ModelConfig` `load_model` would build, from the config alone (no weights read): what the
    engine needs before it starts its ranks (is it a MoE model? how many KV heads?)."""
    if model is None:
        from ..model_files import default_model

        model = default_model()
    files = resolve_model_files(model, load_format)
    return _config_of(files, open_gguf(files.gguf_file) if files.load_format == "gguf" else None)


def load_model(model: str | Path | None, *, load_format: str = "auto", dtype: str | torch.dtype = "auto",
               device: str | torch.device = "cpu", seed: int = 0,
               parallel: ParallelLayout | ParallelContext | None = None,
               progress: bool = True, quantization: str | None = None,
               dummy_weights: str = "normal") -> tuple[nn.Module, ModelConfig]:
    """Build and load a model; returns `(model in eval mode, its ModelConfig)`.

    `model`: a HF directory, a .gguf file (or directory holding one), or for `load_format="dummy"`
    a config.json / directory / preset name; None = the default model (SmolLM2-135M-Instruct).
    `dtype="auto"` keeps the checkpoint's dtype (float32 for GGUF); the returned config's
    `torch_dtype` is the dtype actually loaded (of activations and unquantised weights).
    FP8 checkpoints (`quantization_config`, 128x128 blocks) load as FP8; `quantization="fp8"`
    quantises a full-precision checkpoint per block after loading it. `quantization` int8, int4 or
    gguf hold linear / embedding weights weight-only quantised (layers/weight_only.py;
    `layers.weight_only.quantization_report(model)` says how); None or "none": neither.
    `dummy_weights`: the distribution of `load_format="dummy"` weights (`init_dummy_weights`).
    Bad or truncated files raise ValueError.
    """
    if model is None:
        from ..model_files import default_model

        model = default_model()
    weight_only = quantization if quantization in WEIGHT_SCHEMES else "none"
    if quantization not in (None, "fp8", *WEIGHT_SCHEMES):
        raise ValueError(f"quantization={quantization!r} is not supported (fp8, {', '.join(WEIGHT_SCHEMES)})")
    files = resolve_model_files(model, load_format)
    reader = open_gguf(files.gguf_file) if files.load_format == "gguf" else None
    config = _config_of(files, reader)
    dtype = config.torch_dtype if dtype == "auto" else _as_dtype(dtype)
    quant = config.quantization
    if quant is None and quantization == "fp8":
        quant = QuantizationConfig(from_checkpoint=False)
    config = dataclasses.replace(config, torch_dtype=dtype, quantization=quant)
    device = torch.device(device)
    with torch.device(device), _default_dtype(dtype):
        net = build_model(config, parallel)
    if quant is not None and quant.from_checkpoint:
        if weight_only != "none":
            raise ValueError(f"an FP8 checkpoint loads as FP8; quantization={quantization!r} does not apply")
        convert_to_fp8(net)  # e4m3 weights + block scales, filled by the checkpoint (or dummy init)
    quantized_sources = _quantize(net, weight_only, files, reader)
    if files.load_format == "dummy":
        init_dummy_weights(net, seed, distribution=dummy_weights)
    else:
        if files.load_format == "gguf":
            weights = iterate_gguf_weights(reader, config, files.gguf_file, progress, quantized_sources)
        else:
            weights = iterate_safetensors(files.weight_files, sum(files.tensor_counts), progress)
        loaded = net.load_weights(weights)
        _release_freed_heap()
        missing = sorted(set(named_weights(net)) - loaded)
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(f"{files.weight_files[0].parent}: checkpoint lacks weights for {shown}")
    if quant is not None and not quant.from_checkpoint:
        quantize_to_fp8(net)
    finish_loading(net)
    return net.eval(), config


def load_mtp(model: str | Path, main: nn.Module, *, depth: int = 0, load_format: str = "auto", seed: int = 0,
             progress: bool = True) -> nn.Module:
    """DeepSeek-V3's MTP module `depth` over a loaded main model (`load_model` of the same `model`),
    on its device and dtype, quantised like it, with the checkpoint's layer `num_hidden_layers + depth`
    (random weights for `load_format="dummy"`). ValueError if the checkpoint has no such module."""
    from ..models.deepseek_mtp import DeepseekMTP

    config = main.config
    weight = main.model.embed_tokens.weight
    with torch.device(weight.device), _default_dtype(config.torch_dtype):
        mtp = DeepseekMTP(main, depth)
    quant = config.quantization
    if quant is not None and quant.from_checkpoint:
        convert_to_fp8(mtp)
    files = resolve_model_files(model, load_format)
    if files.load_format == "dummy":
        init_dummy_weights(mtp, seed)
    elif files.load_format == "hf":
        loaded = mtp.load_weights(iterate_safetensors(files.weight_files, sum(files.tensor_counts), progress))
        missing = sorted(set(dict(mtp.named_parameters())) - loaded)
        if missing:
            raise ValueError(f"{files.root}: checkpoint has no complete MTP module model.layers.{mtp.layer_idx} "
                             f"(missing {missing[0]}{f' and {len(missing) - 1} more' if len(missing) > 1 else ''})")
    else:
        raise ValueError(f"MTP modules load from Hugging Face folders or dummy weights, not {files.load_format}")
    if quant is not None and not quant.from_checkpoint:
        quantize_to_fp8(mtp)
    finish_loading(mtp)
    return mtp.eval()


def finish_loading(model: nn.Module) -> None:
    """Run every module's `finish_loading()` hook once the weights are final (e.g. MLA derives a
    full-precision copy of an FP8 `kv_b_proj` for its absorbed attention)."""
    for module in model.modules():
        hook = getattr(module, "finish_loading", None)
        if hook is not None and module is not model:
            hook()


def _release_freed_heap() -> None:
    """Hand the loader's freed temporaries back to the OS: glibc keeps freed heap mapped, and
    converting GGUF blocks leaves ~50 MB of it for a 135M model (resident for the whole run)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _quantize(net: nn.Module, scheme: str, files: ModelFiles, reader) -> set[str]:
    """Apply the weight-only transform; returns the checkpoint names to read quantised."""
    if scheme == "none":
        return set()
    if scheme == "gguf" and files.load_format != "gguf":
        raise ValueError("quantization='gguf' keeps a GGUF file's own block formats; this model is not a GGUF file")
    stacked = getattr(net, "stacked_params", LLAMA_STACKED_PARAMS)
    tensor_formats = gguf_tensor_formats(reader, files.gguf_file) if reader is not None else {}
    sources: dict[str, list[SourceFormat]] = {}
    targets: dict[str, str] = {}
    for name, fmt in tensor_formats.items():
        target, _ = target_of(name, stacked)
        sources.setdefault(target, []).append(fmt)
        targets[name] = target
    formats = plan_formats(net, scheme, sources)
    quantize_weights(net, formats)
    return {name for name, target in targets.items() if target in formats}


def _config_of(files: ModelFiles, reader) -> ModelConfig:
    if files.preset is not None:
        return preset_config(files.preset)
    if files.load_format == "gguf":
        return ModelConfig.from_hf_dict(gguf_hf_config(reader, files.gguf_file), name=str(files.gguf_file))
    return ModelConfig.from_pretrained(files.config_path)


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"float": torch.float32, "half": torch.float16, "bf16": torch.bfloat16, "fp16": torch.float16,
               "fp32": torch.float32}
    resolved = aliases.get(dtype, getattr(torch, str(dtype), None))
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be 'auto' or a floating torch dtype name, got {dtype!r}")
    return resolved


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


DUMMY_DISTRIBUTIONS = ("normal", "uniform")
UNIFORM_BOUND = 1e-3  # vLLM's dummy loader draws every weight from U(-1e-3, 1e-3)


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02, distribution: str = "normal") -> None:
    """Random weights for benchmarks, deterministic per seed.

    normal: N(0, std) matrices and biases, norm weights 1 (activations at a trained model's scale).
    uniform: every weight, norms included, U(-1e-3, 1e-3), as vLLM's `--load-format dummy` draws
    them (for side-by-side runs: the same distribution, not the same values).
    FP8 weights: e4m3 values with block scales (N(0, 1) x std, or U(-1, 1) x 1e-3), the same
    effective distribution; weight-only quantised ones are quantised from such matrices."""
    if distribution not in DUMMY_DISTRIBUTIONS:
        raise ValueError(f"dummy weights {distribution!r}: expected one of {', '.join(DUMMY_DISTRIBUTIONS)}")
    uniform = distribution == "uniform"
    scale = UNIFORM_BOUND if uniform else std

    def draw(shape, generator, device) -> torch.Tensor:  # fp32, unit scale
        if uniform:
            return torch.rand(shape, generator=generator, device=device).mul_(2.0).sub_(1.0)
        return torch.randn(shape, generator=generator, device=device)

    for name, param in named_weights(model).items():
        generator = torch.Generator(device=param.device).manual_seed(seed)
        seed += 1
        if name.endswith("weight_scale_inv"):
            param.fill_(scale)
        elif param.dim() == 1 and name.endswith("norm.weight") and not uniform:
            param.fill_(1.0)
        elif not isinstance(param, torch.Tensor):  # a QuantizedWeight
            param.copy_(draw(param.shape, generator, param.device).mul_(scale))
        elif param.dtype == torch.float8_e4m3fn:
            rows = param.view(-1, param.shape[-1])
            step = max(1, (64 << 20) // param.shape[-1])  # fp32 staging in 256 MB slices
            for start in range(0, rows.shape[0], step):
                part = rows[start : start + step]
                part.copy_(draw(part.shape, generator, param.device).clamp_(-448, 448))
        elif uniform:
            param.uniform_(-UNIFORM_BOUND, UNIFORM_BOUND, generator=generator)
        else:
            param.normal_(0.0, std, generator=generator)
