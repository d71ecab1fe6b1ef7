"""Models split in parts (NAME-00001-of-0000N.gguf): read from the first part as one model,
listed by the hub as one, pulled part by part (each verified, installed together), loaded by
llama.cpp from the first part, removed whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from localinfer.errors import InvalidModelFile
from localinfer.model_store.gguf_info import read_gguf_info

from ..fake_hub import FakeHub
from .test_pull import cli, manifests, one_line_error

REPO = "testorg/SmolLM2-Split-GGUF"
REF = f"hf.co/{REPO}"


def split_gguf(src: Path, out: Path, tensors_per_part: int) -> list[Path]:
    """`src` rewritten as parts of at most this many tensors, as llama.cpp's gguf-split writes
    them (split.no, split.count, split.tensors.count; the metadata in the first part)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents(),
                             split_max_tensors=tensors_per_part)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, [field.contents(i) for i in range(len(field.data))], vtype,
                                 sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), vtype)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape,
                          raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))


@pytest.fixture(scope="module")
def parts(smollm2_path, tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("split")
    return split_gguf(smollm2_path, folder / "SmolLM2-135M-Instruct-Q4_1.gguf", 120)


@pytest.fixture
def hub(parts, quant_files) -> FakeHub:
    fake = FakeHub()
    for part in parts:
        fake.add(REPO, part.name, part)
    fake.add(REPO, "SmolLM2-135M-Instruct-Q8_0.gguf", quant_files["Q8_0"])
    # a set with a part missing is no model
    fake.add(REPO, "SmolLM2-135M-Instruct-Q2_K-00001-of-00002.gguf", parts[0])
    yield fake.start()
    fake.stop()


def test_a_split_model_reads_as_one_from_its_first_part(parts, smollm2_path, tmp_path):
    assert len(parts) == 3 and parts[0].name.endswith("-00001-of-00003.gguf")
    whole, split = read_gguf_info(smollm2_path), read_gguf_info(parts[0])
    assert split.file_size == sum(p.stat().st_size for p in parts)
    assert (split.n_params, split.n_layer, split.quant) == (whole.n_params, whole.n_layer,
                                                            whole.quant)
    with pytest.raises(InvalidModelFile, match="not the first part"):
        read_gguf_info(parts[1])
    alone = tmp_path / parts[0].name  # the first part without the others
    alone.write_bytes(parts[0].read_bytes())
    with pytest.raises(InvalidModelFile, match="part 2 of 3"):
        read_gguf_info(alone)
    renamed = tmp_path / "first.gguf"  # llama.cpp finds the others by the first's name
    renamed.write_bytes(parts[0].read_bytes())
    with pytest.raises(InvalidModelFile, match="-00001-of-00003"):
        read_gguf_info(renamed)


def test_llama_cpp_loads_the_parts_from_the_first(parts, smollm2_path):
    args = ["run", "--temperature", "0", "--max-tokens", "12", "--ctx", "256", "-p",
            "The capital of France is"]
    run = lambda model: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "localinfer", *args[:1], str(model), *args[1:]],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    split, whole = run(parts[0]), run(smollm2_path)
    assert split.returncode == 0, split.stderr
    assert split.stdout.strip() and split.stdout == whole.stdout  # the same tensors


def test_the_hub_lists_a_split_model_as_one_and_show_plans_its_whole_size(hub, parts):
    shown = cli(hub, "show", f"{REF}:Q4_1", "--json")
    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    assert facts["quant"] == "Q4_1" and facts["file_size"] == sum(p.stat().st_size
                                                                  for p in parts)
    one_line_error(cli(hub, "pull", f"{REF}:Q2_K"), "no Q2_K")  # its part 2 is missing


def test_pull_fetches_every_part_verified_and_rm_removes_them(hub, parts, _private_home):
    pulled = cli(hub, "pull", f"{REF}:Q4_1")
    assert pulled.returncode == 0, pulled.stderr
    (manifest,) = manifests(_private_home)
    folder = _private_home / "models" / "hub" / REPO
    assert manifest["file"] == parts[0].name and manifest["parts"] == [p.name for p in parts]
    assert manifest["size"] == sum(p.stat().st_size for p in parts)
    for part in parts:
        assert (folder / part.name).read_bytes() == part.read_bytes()
    answered = cli(hub, "run", f"{REF}:Q4_1", "--max-tokens", "4", "--ctx", "256", "-p", "Hi",
                   offline=True)
    assert answered.returncode == 0 and answered.stdout.strip(), answered.stderr
    assert cli(hub, "rm", f"{REF}:Q4_1").returncode == 0
    assert not list(folder.glob("*.gguf")) and not manifests(_private_home)


def test_a_corrupt_part_installs_nothing_and_the_next_pull_fetches_only_what_is_missing(
        hub, parts, _private_home):
    hub.repos[REPO][parts[1].name].corrupt = True
    one_line_error(cli(hub, "pull", f"{REF}:Q4_1"), "checksum")
    assert not manifests(_private_home)  # the model is not installed with a part bad
    one_line_error(cli(hub, "run", f"{REF}:Q4_1", "-p", "Hi", offline=True), "HF_HUB_OFFLINE")
    hub.repos[REPO][parts[1].name].corrupt = False
    fetched_first = hub.gets[(REPO, parts[0].name)]
    assert cli(hub, "pull", f"{REF}:Q4_1").returncode == 0
    assert hub.gets[(REPO, parts[0].name)] == fetched_first  # verified on disk: kept
    assert hub.gets[(REPO, parts[1].name)] >= 2 and len(manifests(_private_home)) == 1
