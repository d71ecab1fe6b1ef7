from __future__ import annotations


import pytest

from localinfer.errors import ModelFileMissing, ModelNotFound
from localinfer.model_store.gguf_info import read_gguf_info
from localinfer.model_store.sources import DEFAULT_MODEL, resolve


def test_default_model_is_the_packaged_smollm2(tmp_path, smollm2_path):
    model = resolve(DEFAULT_MODEL, tmp_path)
    assert (model.name, model.source, model.path) == ("smollm2:135m", "package", smollm2_path)


def test_base_name_and_latest_resolve_to_the_single_tag(tmp_path):
    assert resolve("smollm2", tmp_path).name == "smollm2:135m"
    assert resolve("SmolLM2:latest", tmp_path).name == "smollm2:135m"


def test_gemma3_is_assembled_once_into_the_store(tmp_path):
    model = resolve("gemma3:270m", tmp_path)
    assert model.path.parent == tmp_path / "embedded"
    assert read_gguf_info(model.path).architecture == "gemma3"
    assert not list(model.path.parent.glob("*.tmp"))  # no half file left behind
    mtime = model.path.stat().st_mtime_ns
    assert resolve("gemma3", tmp_path).path.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_unknown_name_suggests_close_names(tmp_path):
    with pytest.raises(ModelNotFound) as err:
        resolve("smolm2", tmp_path)
    assert "smollm2" in err.value.suggestions
    assert "did you mean" in str(err.value)
    with pytest.raises(ModelNotFound, match="available: gemma3:270m, smollm2:135m"):
        resolve("zzzzzz", tmp_path)


def test_paths(tmp_path, smollm2_path):
    assert resolve(str(smollm2_path), tmp_path).source == "path"
    with pytest.raises(ModelFileMissing, match="no model file at"):
        resolve(str(tmp_path / "missing.gguf"), tmp_path)
