"""A pretrained model shipped as a GGUF file (llama.cpp's format), made a BF16 HF directory once.

``--model`` takes a ``.gguf`` file, or a directory holding one and no ``config.json``. It is
dequantized by transformers' own GGUF loader (``from_pretrained(dir, gguf_file=...)``, which needs
the ``gguf`` package), its tokenizer (chat template included) read the same way, and saved as a
BF16 HF directory: that is the run's version 0, which trainer, actors, vLLM and ``aurora replay``
all read like any other model. The model transformers returns is flagged as quantized and refuses
``save_pretrained``, so the weights go into a model built fresh from the same config. The
directory is cached under ``$AURORA_CACHE_DIR`` (default ``~/.cache/aurora``), named by the file's
SHA-256, written to a temporary name and renamed when complete: a second run, or a second role on
the same host, converts nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from aurora_store.localfile import open_regular
from aurora_store.rl.errors import ModelError

SUFFIX = ".gguf"
log = logging.getLogger(__name__)


def gguf_file(path: str) -> str | None:
    """The GGUF file ``path`` names (the file itself, or the only one in a directory without a
    ``config.json``), or None when ``path`` is not a GGUF model."""
    p = Path(path)
    if p.is_file() and p.name.endswith(SUFFIX):
        return str(p)
    if not p.is_dir() or (p / "config.json").exists():
        return None
    found = sorted(x for x in p.iterdir() if x.name.endswith(SUFFIX) and x.is_file())
    if len(found) > 1:
        raise ModelError(f"{path}: {len(found)} GGUF files ({', '.join(x.name for x in found[:4])}); name one")
    return str(found[0]) if found else None


def cache_dir() -> Path:
    return Path(os.environ.get("AURORA_CACHE_DIR") or Path.home() / ".cache" / "aurora")


def hf_directory(path: str) -> str:
    """The BF16 HF directory of the GGUF model at ``path`` (converted on first use, then cached)."""
    source = gguf_file(path)
    if source is None:
        raise ModelError(f"{path}: not a GGUF file, nor a directory holding one")
    digest = _sha256(source)
    out = cache_dir() / "gguf" / f"{Path(source).name.removesuffix(SUFFIX)}-{digest[:16]}"
    if (out / "config.json").exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        _dequantize(source, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process converted it first: theirs is as good
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:  # a FIFO named as a model is refused, not read forever
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _dequantize(source: str, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(source))
    log.info("dequantizing %s to a BF16 HF directory (once; cached in %s)", source, out.parent)
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.bfloat16, **_dequantize_option()
        )
    except Exception as exc:
        # (struct.error from a truncated header, ValueError without the magic bytes, ImportError without
        # gguf, KeyError for an architecture transformers does not map): each means "cannot use this file"
        raise ModelError(f"cannot load the GGUF model {source}: {type(exc).__name__}: {exc}"[:500]) from None
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("torch_dtype", None)
    config["dtype"] = "bfloat16"
    model_type = config.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config), dtype=torch.bfloat16)
    state = quantized.state_dict()
    if any(not t.is_floating_point() for t in state.values()):
        raise ModelError(f"{source}: transformers left quantized blocks in the model; install `gguf` and retry")
    model.load_state_dict(state, strict=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _dequantize_option() -> dict[str, object]:
    """Ask transformers for dense weights: recent releases keep GGUF blocks when a GGUF matmul
    kernel is installed; older ones always dequantize."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        return {}
    try:
        return {"quantization_config": GgufConfig(dequantize=True)}
    except TypeError:
        return {}
