from __future__ import annotations


import pytest

from localinfer.errors import DiskFull, ModelFileMissing, ModelNotFound
from localinfer.model_store.gguf_info import read_gguf_info
from localinfer.model_store.sources import resolve
from localinfer.settings import DEFAULT_MODEL


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


def test_leftovers_of_dead_unpackings_go_beside_an_unpacked_gemma3(tmp_path, gemma3_path):
    """A temporary file whose unpacking died (its process id in its name, or an earlier
    version's left for ten minutes) goes the next time gemma3 is looked up; one an earlier
    version may be writing now stays."""
    import os
    import time

    import localinfer

    folder = tmp_path / "embedded"
    folder.mkdir()
    os.link(gemma3_path, folder / gemma3_path.name)  # unpacked already (the session's file)
    dead = folder / f".{gemma3_path.name}.999999999.k2j4_x8a.tmp"
    orphan = folder / f".{gemma3_path.name}.ab12cd34.tmp"
    fresh = folder / f".{gemma3_path.name}.zz98yy76.tmp"
    for path in (dead, orphan, fresh):
        path.write_bytes(b"\0" * 1024)
    hour_ago = time.time() - 3600
    os.utime(orphan, (hour_ago, hour_ago))
    assert resolve("gemma3:270m", tmp_path).path == folder / gemma3_path.name
    assert sorted(folder.iterdir()) == sorted([folder / gemma3_path.name, fresh])
    assert str(tmp_path) not in localinfer.__file__  # (the code under test, not a copy)


def test_a_disk_too_small_for_gemma3_is_one_clear_error(small_disk):
    """It was an OSError traceback on the command line and a 500 from the server."""
    with pytest.raises(DiskFull, match=r"needs 2\d\d MiB .* but the disk has [0-4] MiB free"):
        resolve("gemma3:270m", small_disk)
    assert not list((small_disk / "embedded").iterdir())  # nothing half-written left


def test_a_disk_that_fills_while_gemma3_is_written_is_one_clear_error(small_disk, monkeypatch):
    """Another program took the room between the check and the write: the first reading of
    the free space says 1 TiB, the write then runs out."""
    import shutil

    real, readings = shutil.disk_usage, []

    def first_reading_wrong(path):
        readings.append(path)
        return shutil._ntuple_diskusage(2**40, 0, 2**40) if len(readings) == 1 else real(path)

    monkeypatch.setattr(shutil, "disk_usage", first_reading_wrong)
    with pytest.raises(DiskFull, match="free some space"):
        resolve("gemma3:270m", small_disk)
    assert len(readings) == 2 and not list((small_disk / "embedded").iterdir())


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


def test_a_files_digest_is_computed_once_and_again_when_it_changes(tmp_path, monkeypatch):
    import hashlib
    import os

    from localinfer.model_store import hub
    from localinfer.model_store.sources import digest

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    hashed = []
    real = hub.file_sha256
    monkeypatch.setattr(hub, "file_sha256", lambda p: hashed.append(p) or real(p))
    first = digest(model, tmp_path / "models")
    assert first == hashlib.sha256(model.read_bytes()).hexdigest()
    assert digest(model, tmp_path / "models") == first and len(hashed) == 1  # kept
    model.write_bytes(b"GGUF" + bytes(999) + b"x")
    os.utime(model, ns=(1, 1))
    assert digest(model, tmp_path / "models") != first and len(hashed) == 2  # changed: anew
    assert digest(model, tmp_path / "models", known="abc") == "abc"  # a pulled one's manifest
    (tmp_path / "models" / "digests.json").write_text("[not json")
    assert digest(model, tmp_path / "models") == hashlib.sha256(model.read_bytes()).hexdigest()
