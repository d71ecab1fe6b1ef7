"""`localinfer launch AGENT`: a coding agent, unmodified, on this machine's models.

As `ollama launch` does: find the local server (or start one in this process for the
agent's run), pick a model that can serve the agent — its chat template writes tools, and
its context holds the agent's first request (Claude Code's is ~19,000 tokens with its tools,
Codex's ~10,000) — write the agent's configuration for this run only (its environment and
command-line overrides, and for aider and Continue's CLI a file in localinfer's own home
naming the model's window: never the user's files), and run the agent. A server started
here listens on loopback with a key made for this launch, which only the agent is given,
and stops when the agent ends.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from localinfer.backends.base import LoadOptions
from localinfer.errors import LocalinferError
from localinfer.files import write_atomically
from localinfer.settings import Settings

__all__ = ["AGENTS", "Agent", "Candidate", "Server", "agent_command", "choose_model", "find",
           "launch"]

log = logging.getLogger("localinfer.launch")


@dataclass(frozen=True)
class Server:
    url: str  # http://host:port, no path
    key: str | None  # the API key it wants, if any
    n_ctx: int  # the context a model gets there, as far as is known


@dataclass(frozen=True)
class Agent:
    name: str  # what `launch` calls it
    program: str  # its command
    install: str  # the command that installs it
    title: str  # as people call it
    prompt_tokens: int  # about how long its first request is, tools and all
    # (its environment and its arguments for a server, a model, that model's context and
    # a folder of localinfer's own for files the run needs)
    configure: Callable[[Server, str, int, Path], tuple[dict[str, str], list[str]]]
    tools: bool = True  # it calls tools, so its model's template must write them

    @property
    def context(self) -> int:
        """The context a model needs to serve it: the first request and room to work in."""
        need = self.prompt_tokens * 3 // 2
        return 1 << (need - 1).bit_length()


_QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1"}


def _claude(server: Server, model: str, n_ctx: int, folder: Path
            ) -> tuple[dict[str, str], list[str]]:
    """Claude Code reads its endpoint, key and models from its environment; the one
    model stands for each of its tiers."""
    env = {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_AUTH_TOKEN": server.key or "localinfer",
           "ANTHROPIC_API_KEY": "", "ANTHROPIC_MODEL": model,
           "ANTHROPIC_SMALL_FAST_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
           "ANTHROPIC_DEFAULT_SONNET_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
           # its window, not its own models' (it warns of an unknown model's and takes 1M)
           "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(n_ctx),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **_QUIET}
    return env, []


def _codex(server: Server, model: str, n_ctx: int, folder: Path
           ) -> tuple[dict[str, str], list[str]]:
    """Codex takes a provider of its own by `-c` overrides of its config (the Responses
    API, its only wire API); the key goes by the environment variable it names."""
    provider = (f'{{name="localinfer",base_url="{server.url}/v1",wire_api="responses",'
                f'env_key="LOCALINFER_AGENT_KEY"}}')
    overrides = {"model_provider": '"localinfer"', "model_providers.localinfer": provider,
                 "model": json.dumps(model), "model_context_window": str(n_ctx),
                 "model_auto_compact_token_limit": str(n_ctx * 85 // 100),
                 "check_for_update_on_startup": "false"}
    args = [arg for key, value in overrides.items() for arg in ("-c", f"{key}={value}")]
    return {"LOCALINFER_AGENT_KEY": server.key or "localinfer"}, args


def _opencode(server: Server, model: str, n_ctx: int, folder: Path
              ) -> tuple[dict[str, str], list[str]]:
    """OpenCode takes a whole config in OPENCODE_CONFIG_CONTENT, over the user's own."""
    config = {"$schema": "https://opencode.ai/config.json", "model": f"localinfer/{model}",
              "small_model": f"localinfer/{model}", "autoupdate": False, "share": "disabled",
              "provider": {"localinfer": {
                  "npm": "@ai-sdk/openai-compatible", "name": "localinfer",
                  "options": {"baseURL": f"{server.url}/v1",
                              "apiKey": server.key or "localinfer"},
                  "models": {model: {"name": model, "tool_call": True, "limit": {
                      "context": n_ctx, "output": min(8192, n_ctx // 4)}}}}}}
    env = {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1"}
    return env, []


def _qwen(server: Server, model: str, n_ctx: int, folder: Path
          ) -> tuple[dict[str, str], list[str]]:
    """Qwen Code speaks OpenAI's chat completions, configured by its environment."""
    return {"OPENAI_BASE_URL": f"{server.url}/v1", "OPENAI_API_KEY": server.key or "localinfer",
            "OPENAI_MODEL": model, **_QUIET}, []


def _aider(server: Server, model: str, n_ctx: int, folder: Path
           ) -> tuple[dict[str, str], list[str]]:
    """aider takes OpenAI's chat completions through its environment (AIDER_* are its
    options, so the user's own flags still win). It knows no local model's window: a
    metadata file says it, or it warns of an unknown model and reports a prompt past the
    window as "of 0" tokens. Its window in that file is the one the server gives."""
    name = f"openai/{model}"
    facts = {name: {"max_input_tokens": n_ctx, "max_tokens": n_ctx,
                    "max_output_tokens": min(8192, n_ctx // 4), "input_cost_per_token": 0.0,
                    "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}}
    path = _run_file(folder, "aider", ".json", json.dumps(facts, indent=1))
    return {"OPENAI_API_BASE": f"{server.url}/v1", "OPENAI_API_KEY": server.key or "localinfer",
            "AIDER_MODEL": name, "AIDER_MODEL_METADATA_FILE": str(path),
            "AIDER_CHECK_UPDATE": "false", "AIDER_ANALYTICS": "false"}, []


def _continue(server: Server, model: str, n_ctx: int, folder: Path
              ) -> tuple[dict[str, str], list[str]]:
    """Continue's CLI (`cn`) reads its models from a config file it is given; the key is
    not written there but named as a secret, which it reads from its environment."""
    if "${{" in model:  # (the CLI would read it as a secret's name)
        raise LocalinferError(f"Continue's CLI cannot be given a model named {model!r}")
    config = {"name": "localinfer", "version": "1.0.0", "schema": "v1", "models": [{
        "name": model, "provider": "openai", "model": model, "apiBase": f"{server.url}/v1",
        "apiKey": "${{ secrets.LOCALINFER_AGENT_KEY }}", "roles": ["chat", "edit", "apply"],
        "defaultCompletionOptions": {"contextLength": n_ctx,
                                     "maxTokens": min(8192, n_ctx // 4)}}]}
    # (JSON is YAML: the file needs no YAML writer)
    path = _run_file(folder, "continue", ".yaml", json.dumps(config, indent=1))
    return {"LOCALINFER_AGENT_KEY": server.key or "localinfer"}, ["--config", str(path)]


def _run_file(folder: Path, agent: str, suffix: str, text: str) -> Path:
    """A file an agent reads for this run, in localinfer's folder for them, named by what
    it holds (a model, its window, a server's address): launches side by side do not
    write each other's."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / f"{agent}-{digest}{suffix}"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text)
    return path


def _npm(package: str) -> str:
    return f"npm install -g {package}"


AGENTS = {agent.name: agent for agent in (
    Agent("claude", "claude", _npm("@anthropic-ai/claude-code"), "Claude Code", 19_000,
          _claude),
    Agent("codex", "codex", _npm("@openai/codex"), "Codex", 10_000, _codex),
    Agent("opencode", "opencode", _npm("opencode-ai"), "OpenCode", 9_000, _opencode),
    Agent("qwen", "qwen", _npm("@qwen-code/qwen-code"), "Qwen Code", 12_000, _qwen),
    # (its prompt without files: ~1,500 tokens, its map of the repository 1,000 more)
    Agent("aider", "aider", "python3 -m pip install aider-install && aider-install", "aider",
          4_000, _aider, tools=False),
    Agent("continue", "cn", _npm("@continuedev/cli"), "Continue's CLI", 4_000, _continue),
)}


def find(agent: str) -> Agent:
    try:
        return AGENTS[agent]
    except KeyError:
        raise LocalinferError(f"no agent '{agent}' — launch one of: "
                              f"{', '.join(AGENTS)}") from None


def _program(agent: Agent) -> str:
    program = shutil.which(agent.program)
    if program is None:
        raise LocalinferError(f"{agent.title} is not installed — install it with "
                              f"`{agent.install}`")
    return program


def agent_command(agent: Agent, server: Server, model: str, n_ctx: int, args: Sequence[str],
                  folder: Path) -> tuple[list[str], dict[str, str]]:
    """The agent's command line and its whole environment for this run (`folder`:
    localinfer's own, for the files it needs)."""
    env, config = agent.configure(server, model, n_ctx, folder)
    return [_program(agent), *config, *args], {**os.environ, **env}


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Candidate:
    name: str
    size: int
    tools: bool  # its chat template writes tools
    trained: int  # the context it was trained on


def _candidates(client: httpx.Client) -> list[Candidate]:
    found = []
    for model in _json(client.get("/api/tags")).get("models", []):
        shown = _json(client.post("/api/show", json={"model": model["name"]}))
        capabilities = shown.get("capabilities") or []
        if "completion" not in capabilities:
            continue  # an embedding model
        info = shown.get("model_info") or {}
        trained = next((v for k, v in info.items() if k.endswith(".context_length")), 0)
        found.append(Candidate(model["name"], model.get("size") or 0, "tools" in capabilities,
                               int(trained or 0)))
    return found


def choose_model(candidates: Sequence[Candidate], agent: Agent) -> Candidate:
    """The largest installed model whose template writes tools (where the agent calls
    them) and whose trained context holds what the agent needs; one line saying what to
    pull when none does."""
    fit = [c for c in candidates if (c.tools or not agent.tools) and c.trained >= agent.context]
    if not fit:
        needs = "one whose chat template takes tools, with" if agent.tools else "one with"
        raise LocalinferError(
            f"no installed model can serve {agent.title}: it needs {needs} a "
            f"{agent.context:,}-token context — pull one (e.g. `localinfer pull qwen3:8b`) or "
            f"name one with --model")
    return max(fit, key=lambda c: c.size)


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        try:
            said = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            said = response.text[:200]
        raise LocalinferError(f"the server answered {response.status_code}: {said}")
    return response.json()


# ---------------------------------------------------------------------------- the server
def _running(settings: Settings) -> Server | None:
    """The local server the settings name, when one answers there."""
    url = f"http://{settings.host}:{settings.port}"
    try:
        answer = httpx.get(url + "/health", timeout=1.0)
    except httpx.TransportError:
        return None
    if answer.status_code not in (200, 503) or "models_loaded" not in answer.text:
        return None  # another program on that port
    return Server(url, settings.api_key, settings.ctx)


def _loaded_context(client: httpx.Client, model: str) -> int | None:
    """Load the model (Ollama's empty generate) and read the context the server gave it."""
    _json(client.post("/api/generate", json={"model": model}, timeout=600))
    for entry in _json(client.get("/api/ps")).get("models", []):
        if entry.get("name") == model:
            return int(entry.get("context_length") or 0) or None
    return None


def launch(agent: Agent, settings: Settings, model: str | None, args: Sequence[str],
           n_ctx: int | None = None, verbose: bool = False) -> int:
    """Run the agent on a local server; its exit status. n_ctx: the context a server started
    here gives each model (within what it was trained on); else what the agent needs."""
    _program(agent)  # (not installed: said before any server starts)
    server = _running(settings)
    started = thread = None
    if server is None:  # one for this run, in this process: loopback, a key of its own
        from localinfer.api.server import serve_in_thread

        key = secrets.token_urlsafe(24)
        mine = settings.model_copy(update={
            "host": "127.0.0.1", "port": 0, "api_key": key,
            "ctx": n_ctx or max(settings.ctx, agent.context)})  # (within each model's training)
        options = LoadOptions.from_settings(mine, n_slots=mine.parallel)
        url, started, thread = serve_in_thread(mine, options, None, verbose)
        server = Server(url, key, mine.ctx)
        log.info("serving %s on %s for this run", agent.title, url)
    try:
        headers = {"Authorization": f"Bearer {server.key}"} if server.key else {}
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
            candidates = _candidates(client)
            if model is None:
                model = choose_model(candidates, agent).name
            elif model not in {c.name for c in candidates}:
                _json(client.post("/api/show", json={"model": model}))  # its 404, in its words
            window = _loaded_context(client, model) or server.n_ctx
        if window < agent.prompt_tokens:
            log.warning("%s gets a %d-token context on %s, and %s's first request is about "
                        "%d tokens — start the server with --ctx %d", model, window, server.url,
                        agent.title, agent.prompt_tokens, agent.context)
        log.info("%s on %s with %s, a %d-token context", agent.title, server.url, model,
                 window)
        command, env = agent_command(agent, server, model, window, args,
                                     settings.home / "launch")
        if started is None:  # the server lives on without us: the agent takes our place
            os.execvpe(command[0], command, env)
        return _run_beside(command, env)
    finally:
        if started is not None:
            started.handle_exit(0, None)  # its streams end with their last chunk, as serve's
            thread.join(timeout=10)


def _run_beside(command: list[str], env: dict[str, str]) -> int:
    """The agent as our child, the server meanwhile on our thread: Ctrl-C is the agent's
    (it shares our terminal), not ours."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = subprocess.Popen(command, env=env,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return process.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
