"""`localinfer pull/list/rm/run` against a fake hub over real HTTP, with real GGUF quants."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..fake_hub import FakeHub, ForwardingProxy

REPO = "testorg/SmolLM2-135M-Instruct-GGUF"
REF = f"hf.co/{REPO}"


@pytest.fixture
def hub(quant_files) -> FakeHub:
    fake = FakeHub()
    for label, path in quant_files.items():
        fake.add(REPO, f"SmolLM2-135M-Instruct-{label}.gguf", path)
    fake.repos["testorg/no-gguf"] = {}
    yield fake.start()
    fake.stop()


def cli(hub: FakeHub, *args: str, offline: bool = False, proxy: str | None = None,
        **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": os.environ["LOCALINFER_HOME"] + "-hf",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_TOKEN", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if proxy:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(name, None)
        env.update(HTTP_PROXY=proxy, HTTPS_PROXY=proxy)
    return subprocess.run([sys.executable, "-m", "localinfer", *args], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def manifests(home: Path) -> list[dict]:
    folder = home / "models" / "manifests"
    return [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []


def one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[-1]


def test_pull_plans_the_quant_verifies_and_registers(hub, _private_home):
    result = cli(hub, "pull", REF)
    assert result.returncode == 0, result.stderr
    # CPU only: the best quant not above Q4_K_M; Q8_0 would be slower for little gain
    assert "Q4_K_M" in result.stderr and "verified" in result.stderr
    assert any(r.startswith("bytes=0-") for r in hub.ranges)  # the header was read remotely
    (manifest,) = manifests(_private_home)
    assert (manifest["name"], manifest["quant"], manifest["repo"]) == (REF, "Q4_K_M", REPO)
    file = _private_home / "models" / "hub" / REPO / manifest["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == manifest["sha256"]
    assert not any((_private_home / "models" / "hub" / REPO / ".staging").glob("*.gguf"))
    listed = cli(hub, "list")
    assert REF in listed.stdout and "Q4_K_M" in listed.stdout
    # gemma3, not unpacked yet, has the size it will have (it was "—" while show said 241 MiB)
    assert not (_private_home / "models" / "embedded").exists()
    assert re.search(r"^gemma3:270m +embedded +241 MiB", listed.stdout, re.M), listed.stdout
    # the columns line up however long a name is (a hub name is longer than 32 characters)
    lines = listed.stdout.splitlines()
    assert len({line.index("SIZE") + 4 if i == 0 else line.index(" MiB") + 4
                for i, line in enumerate(lines) if "SIZE" in line or " MiB" in line}) == 1


def test_show_plans_a_hub_model_before_it_is_pulled(hub, _private_home):
    """`show` of a model not pulled: its header read remotely, every quant's size from the
    listing, the plan for the hardware named — and nothing downloaded."""
    result = cli(hub, "show", REF, "--gpu", "24GiB", "--gpu", "12GiB", "--ram", "64GiB",
                 "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["quant"] in ("Q8_0", "F16") and "not pulled" in facts["path"]
    assert facts["plan"]["what_if"] and facts["plan"]["placement"][0]["index"] == 0
    assert all(r.startswith("bytes=0-") for r in hub.ranges)  # headers only
    assert manifests(_private_home) == []
    asked = cli(hub, "show", f"{REF}:Q4_K_M")  # a quant named: that file's plan
    assert asked.returncode == 0 and "Q4_K_M" in asked.stdout.splitlines()[0], asked.stderr


def test_explicit_quant_then_run_offline(hub, _private_home):
    assert cli(hub, "pull", f"{REF}:q8_0").returncode == 0
    assert manifests(_private_home)[0]["quant"] == "Q8_0"
    ran = cli(hub, "run", f"{REF}:Q8_0", "-p", "Say hi.", "--max-tokens", "4", offline=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() and "generated 4 tok" in ran.stderr


def test_run_pulls_a_missing_hub_model_first(hub, _private_home):
    ran = cli(hub, "run", f"{REF}:Q4_1", "-p", "Say hi.", "--max-tokens", "3")
    assert ran.returncode == 0, ran.stderr
    assert "pulling" in ran.stderr and manifests(_private_home)[0]["quant"] == "Q4_1"


def test_an_interrupted_transfer_resumes(hub, _private_home):
    entry = hub.repos[REPO]["SmolLM2-135M-Instruct-Q4_1.gguf"]
    entry.drop_after = entry.size // 2
    first = cli(hub, "pull", f"{REF}:Q4_1")
    if first.returncode != 0:  # the client gave up: the next pull picks up where it stopped
        one_line_error(first)
        assert manifests(_private_home) == []
        assert cli(hub, "pull", f"{REF}:Q4_1").returncode == 0
    resumed = [r for r in hub.ranges if not r.startswith("bytes=0-")]
    assert resumed and int(resumed[0][6:].split("-")[0]) > 0
    (manifest,) = manifests(_private_home)
    file = _private_home / "models" / "hub" / REPO / manifest["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry.sha256


@pytest.mark.slow
def test_a_pull_killed_midway_resumes_and_leaves_nothing_behind(hub, _private_home):
    """kill -9 a pull a few MiB in: the next pull asks only for the rest, and no partial file
    stays in the staging folder."""
    import signal
    import time

    entry = hub.repos[REPO]["SmolLM2-135M-Instruct-Q4_1.gguf"]
    entry.rate = 8 * 2**20  # bytes a second: ~12 s for the whole file
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "HF_HOME": os.environ["LOCALINFER_HOME"] + "-hf"}
    first = subprocess.Popen([sys.executable, "-m", "localinfer", "pull", f"{REF}:Q4_1"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while entry.sent < 16 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = entry.sent
    assert 16 * 2**20 <= killed_at < entry.size
    entry.rate = None
    assert cli(hub, "pull", f"{REF}:Q4_1").returncode == 0
    resumed = [int(r[6:].split("-")[0]) for r in hub.ranges if not r.startswith("bytes=0-")]
    assert resumed and resumed[-1] >= 8 * 2**20  # most of what had come was kept
    assert entry.sent - killed_at < entry.size - 8 * 2**20  # and not sent again
    staging = _private_home / "models" / "hub" / REPO / ".staging"
    left = [p for p in staging.rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert left == [] or all(p.name.endswith(".metadata") for p in left), left
    (manifest,) = manifests(_private_home)
    file = _private_home / "models" / "hub" / REPO / manifest["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry.sha256


def test_a_corrupted_file_is_rejected_and_nothing_is_registered(hub, _private_home):
    hub.repos[REPO]["SmolLM2-135M-Instruct-Q8_0.gguf"].corrupt = True
    one_line_error(cli(hub, "pull", f"{REF}:Q8_0"), "checksum")
    assert manifests(_private_home) == []
    assert not list((_private_home / "models" / "hub").rglob("*Q8_0.gguf"))
    assert REF not in cli(hub, "list").stdout


def test_two_concurrent_pulls_do_one_download(hub, _private_home):
    env_cli = lambda: subprocess.Popen(  # noqa: E731
        [sys.executable, "-m", "localinfer", "pull", f"{REF}:Q8_0"],
        env={**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(_private_home) + "-hf",
             "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [env_cli(), env_cli()]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert hub.gets[(REPO, "SmolLM2-135M-Instruct-Q8_0.gguf")] == 1
    assert len(manifests(_private_home)) == 1


def test_rm_deletes_the_file_and_the_entry(hub, _private_home):
    assert cli(hub, "pull", f"{REF}:Q4_1").returncode == 0
    file = _private_home / "models" / "hub" / REPO / "SmolLM2-135M-Instruct-Q4_1.gguf"
    assert file.is_file()
    removed = cli(hub, "rm", f"{REF}:Q4_1")
    assert removed.returncode == 0, removed.stderr
    assert not file.exists() and manifests(_private_home) == []
    # not "no models are available", while the embedded two are
    one_line_error(cli(hub, "rm", f"{REF}:Q4_1"), "not found", "no pulled model to remove")
    assert cli(hub, "pull", f"{REPO}:Q4_1").returncode == 0  # spelled without hf.co/
    removed = cli(hub, "rm", f"{REPO}:Q4_1")
    assert removed.returncode == 0 and f"deleted hf.co/{REPO}:Q4_1" in removed.stdout, \
        removed.stderr
    assert not file.exists() and manifests(_private_home) == []
    one_line_error(cli(hub, "rm", "smollm2:135m"), "cannot be deleted")
    one_line_error(cli(hub, "rm", "smollm2"), "cannot be deleted")  # the short name too


def test_a_server_that_ignores_the_range_gives_the_whole_file_anew(hub, _private_home):
    """A partial file is there, but the server answers a range request with the whole file
    (200): it must be written from the start, not appended to what was there."""
    entry = hub.repos[REPO]["SmolLM2-135M-Instruct-Q4_1.gguf"]
    staging = _private_home / "models" / "hub" / REPO / ".staging"
    staging.mkdir(parents=True)
    partial = staging / f"SmolLM2-135M-Instruct-Q4_1.gguf.{entry.sha256[:16]}.partial"
    partial.write_bytes(entry.path.read_bytes()[:5_000_000])
    entry.whole = True
    assert cli(hub, "pull", f"{REF}:Q4_1").returncode == 0
    (manifest,) = manifests(_private_home)
    file = _private_home / "models" / "hub" / REPO / manifest["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry.sha256
    assert not partial.exists()


def test_a_gated_file_says_to_accept_its_terms_and_set_a_token(hub, _private_home):
    hub.repos[REPO]["SmolLM2-135M-Instruct-Q8_0.gguf"].refuse = 403
    one_line_error(cli(hub, "pull", f"{REF}:Q8_0"), "gated", "HF_TOKEN")
    assert manifests(_private_home) == []


def test_offline_mode_names_the_way_out(hub):
    one_line_error(cli(hub, "pull", REF, offline=True), "HF_HUB_OFFLINE")
    one_line_error(cli(hub, "run", REF, "-p", "hi", offline=True), "HF_HUB_OFFLINE")


def test_what_the_hub_does_not_have(hub):
    one_line_error(cli(hub, "pull", "hf.co/testorg/missing-repo"), "not found")
    one_line_error(cli(hub, "pull", "hf.co/testorg/no-gguf"), "no GGUF model")
    one_line_error(cli(hub, "pull", f"{REF}:Q3_K_M"), "Q8_0", "Q4_K_M", "Q4_1")
    one_line_error(cli(hub, "pull", "llama3.2:9b"), "llama3.2:1b", "llama3.2:3b")
    one_line_error(cli(hub, "pull", "lama3.2"), "llama3.2")
    # a name like no other: what can be pulled, not the installed names (which `run` lists)
    unknown = cli(hub, "pull", "nosuchthing")
    one_line_error(unknown, "the catalog has ", "qwen3, ", "hf.co/OWNER/REPO[:QUANT]")
    assert "smollm2:135m" not in unknown.stderr
    # a path is not a hub repo named "./missing.gguf", asked of the hub (which said "not found")
    one_line_error(cli(hub, "pull", "./missing.gguf"), "no model file at './missing.gguf'")


def test_a_pull_goes_through_the_proxy_on_one_connection(hub, _private_home):
    """HTTP_PROXY / HTTPS_PROXY are honoured, and the listing, the header reads and the file
    share the client's connections instead of a new one each."""
    proxy = ForwardingProxy().start()
    try:
        result = cli(hub, "pull", REF, proxy=proxy.url)
    finally:
        proxy.stop()
    assert result.returncode == 0, result.stderr
    assert proxy.requests >= 3  # the listing, a header, the file
    assert proxy.connections < proxy.requests, (proxy.connections, proxy.requests)
    (manifest,) = manifests(_private_home)
    assert hub.gets[(REPO, manifest["file"])] == 1


def test_a_busy_hub_is_asked_again(hub, _private_home):
    hub.busy = [503, 429]  # the listing's first two tries
    result = cli(hub, "pull", f"{REF}:Q4_1")
    assert result.returncode == 0, result.stderr
    assert not hub.busy and len(manifests(_private_home)) == 1
    hub.busy = [503] * 3  # every try: the error says what it was
    one_line_error(cli(hub, "pull", f"{REF}:Q8_0"), "503")


def test_a_proxy_that_cannot_be_reached_is_named(hub):
    one_line_error(cli(hub, "pull", REF, proxy="http://127.0.0.1:9"),
                   "cannot reach", "HTTPS_PROXY")


def test_an_unreachable_hub_fails_fast(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "localinfer", "pull", "llama3.2:1b"], capture_output=True,
        text=True, timeout=60, env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9",
                                    "HF_HOME": str(tmp_path / "hf")})
    one_line_error(result, "cannot reach")


VISION_REPO = "testorg/gemma-3-vision-GGUF"


@pytest.fixture
def vision_hub(gemma3_path, tmp_path) -> FakeHub:
    """A vision model's repo as they are laid out: the model, and its projector in two types
    (the f16 one is the one to take)."""
    from PIL import Image

    from ..families import projector

    fake = FakeHub()
    fake.add(VISION_REPO, "gemma-3-270m-Q4_K_M.gguf", gemma3_path)
    made = projector(gemma3_path, 64)
    fake.add(VISION_REPO, "mmproj-F32.gguf", made)
    fake.add(VISION_REPO, "mmproj-F16.gguf", made)
    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "red.png")
    yield fake.start()
    fake.stop()


def test_pull_fetches_a_vision_models_projector_with_it(vision_hub, _private_home, tmp_path):
    ref = f"hf.co/{VISION_REPO}"
    shown = cli(vision_hub, "show", ref, "--json")  # before the pull: its header read remotely
    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)["projector"]
    assert (facts["file"], facts["type"]) == ("mmproj-F16.gguf", "gemma3")
    assert facts["memory_bytes"] > facts["file_size"]  # the compute buffer of one image

    pulled = cli(vision_hub, "pull", ref)
    assert pulled.returncode == 0, pulled.stderr
    (manifest,) = manifests(_private_home)
    assert manifest["projector"] == "mmproj-F16.gguf"
    folder = _private_home / "models" / "hub" / VISION_REPO
    assert (folder / "mmproj-F16.gguf").is_file() and not (folder / "mmproj-F32.gguf").exists()
    assert vision_hub.gets[(VISION_REPO, "mmproj-F32.gguf")] == 0

    shown = cli(vision_hub, "show", manifest["name"], offline=True)
    assert "vision: mmproj-F16.gguf (gemma3, F16)" in shown.stdout, shown.stdout
    ran = cli(vision_hub, "run", manifest["name"], "--image", str(tmp_path / "red.png"), "-p",
              "What is it?", "--max-tokens", "2", offline=True)
    assert ran.returncode == 0, ran.stderr
    assert int(re.search(r"prompt (\d+) tok", ran.stderr).group(1)) >= 64

    removed = cli(vision_hub, "rm", manifest["name"])
    assert removed.returncode == 0, removed.stderr
    assert not any(folder.glob("*.gguf"))  # the projector goes with its model


def test_a_projector_is_taken_from_the_models_own_folder():
    from localinfer.model_store.hub import RemoteFile, pick_projector

    def file(path: str, size: int = 10) -> RemoteFile:
        from localinfer.model_store.hub import quant_of

        return RemoteFile(path, size, None, quant_of(path))

    projectors = [file("mmproj-BF16.gguf"), file("big/mmproj-model-f16.gguf"),
                  file("big/mmproj-model-f32.gguf", 5), file("mmproj-Q8_0.gguf", 1)]
    assert pick_projector(projectors, file("big/model-Q4_K_M.gguf")).path == \
        "big/mmproj-model-f16.gguf"
    assert pick_projector(projectors, file("model-Q4_K_M.gguf")).path == "mmproj-BF16.gguf"
    assert pick_projector(projectors[3:], file("model-Q4_K_M.gguf")).path == "mmproj-Q8_0.gguf"
    assert pick_projector([], file("model-Q4_K_M.gguf")) is None


def test_a_catalog_reranker_is_pulled_by_its_short_name(_private_home):
    """`qwen3-reranker` names the catalog's repo; its file is found by the quant label as that
    repo writes it (Qwen3-Reranker-0.6B.Q8_0.gguf), pulled, listed, and seen as a reranker."""
    from localinfer.model_store.gguf_info import read_gguf_info

    from ..families import reranker_model

    fake = FakeHub()
    fake.add("giladgd/Qwen3-Reranker-0.6B-GGUF", "Qwen3-Reranker-0.6B.Q8_0.gguf",
             reranker_model("qwen3"))
    hub = fake.start()
    try:
        result = cli(hub, "pull", "qwen3-reranker")
        assert result.returncode == 0, result.stderr
        (manifest,) = manifests(_private_home)
        assert manifest["repo"] == "giladgd/Qwen3-Reranker-0.6B-GGUF"
        path = _private_home / "models" / "hub" / manifest["repo"] / manifest["file"]
        assert read_gguf_info(path).rerank
        assert "qwen3-reranker" in cli(hub, "list").stdout
    finally:
        fake.stop()
