"""`localinfer launch`'s choices, as data: which installed model serves an agent, and each
agent's settings for one run (the agents themselves run in tests/api/test_agents.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localinfer.errors import LocalinferError
from localinfer.launch import AGENTS, Candidate, Server, choose_model, find

GiB = 1 << 30
EMBEDDED = [Candidate("smollm2:135m", GiB // 10, tools=False, trained=8192),
            Candidate("gemma3:270m", GiB // 4, tools=False, trained=32768)]


def test_the_largest_model_with_tools_and_the_context_the_agent_needs():
    small = Candidate("qwen3:1.7b", 1 * GiB, tools=True, trained=40960)
    large = Candidate("qwen3:8b", 5 * GiB, tools=True, trained=40960)
    short = Candidate("mistral:16k", 9 * GiB, tools=True, trained=16384)
    assert choose_model([*EMBEDDED, small, large, short], AGENTS["claude"]) == large
    assert choose_model([*EMBEDDED, short], AGENTS["opencode"]) == short  # (16,384 needed)
    with pytest.raises(LocalinferError, match="no installed model can serve Claude Code.*"
                                              "32,768-token context.*localinfer pull"):
        choose_model([*EMBEDDED, short], AGENTS["claude"])


def test_aider_needs_no_tools_only_the_context():
    """aider writes its edits as text: a model without tools serves it, where its trained
    context holds aider's prompt (8,192 tokens)."""
    assert choose_model(EMBEDDED, AGENTS["aider"]).name == "gemma3:270m"
    assert choose_model(EMBEDDED[:1], AGENTS["aider"]).name == "smollm2:135m"
    with pytest.raises(LocalinferError, match="can serve aider: it needs one with a "
                                              "8,192-token context"):
        choose_model([Candidate("tiny", GiB // 10, tools=False, trained=4096)], AGENTS["aider"])


def test_an_unknown_agent_is_one_line_naming_the_ones_there_are():
    with pytest.raises(LocalinferError,
                       match="launch one of: claude, codex, opencode, qwen, aider, continue"):
        find("cursor")


def test_each_agents_settings_name_the_server_the_model_and_its_window(tmp_path):
    server = Server("http://127.0.0.1:4321", "k3y", 32768)
    env, args = AGENTS["claude"].configure(server, "qwen3:8b", 32768, tmp_path)
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_AUTH_TOKEN"], env["ANTHROPIC_MODEL"],
            env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]) == (server.url, "k3y", "qwen3:8b", "32768")
    env, args = AGENTS["codex"].configure(server, "qwen3:8b", 32768, tmp_path)
    overrides = dict(a.split("=", 1) for a in args[1::2])
    assert args[::2] == ["-c"] * len(overrides) and env["LOCALINFER_AGENT_KEY"] == "k3y"
    assert 'base_url="http://127.0.0.1:4321/v1"' in overrides["model_providers.localinfer"]
    assert overrides["model_context_window"] == "32768"
    env, args = AGENTS["opencode"].configure(server, "qwen3:8b", 32768, tmp_path)
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["localinfer"]
    assert config["model"] == "localinfer/qwen3:8b" and provider["options"]["apiKey"] == "k3y"
    assert provider["models"]["qwen3:8b"]["limit"]["context"] == 32768
    env, args = AGENTS["aider"].configure(server, "qwen3:8b", 32768, tmp_path / "launch")
    assert (env["OPENAI_API_BASE"], env["OPENAI_API_KEY"], env["AIDER_MODEL"], args) == (
        "http://127.0.0.1:4321/v1", "k3y", "openai/qwen3:8b", [])
    facts = json.loads(Path(env["AIDER_MODEL_METADATA_FILE"]).read_text())
    assert facts["openai/qwen3:8b"]["max_input_tokens"] == 32768
    again, _ = AGENTS["aider"].configure(server, "qwen3:8b", 8192, tmp_path / "launch")
    assert again["AIDER_MODEL_METADATA_FILE"] != env["AIDER_MODEL_METADATA_FILE"]  # its own
    env, args = AGENTS["continue"].configure(server, "qwen3:8b", 32768, tmp_path / "launch")
    assert args[0] == "--config" and env == {"LOCALINFER_AGENT_KEY": "k3y"}
    text = Path(args[1]).read_text()
    assert "k3y" not in text  # the key is read from the environment, not written down
    model, = json.loads(text)["models"]  # (JSON: a YAML file)
    assert (model["apiBase"], model["model"], model["defaultCompletionOptions"]["contextLength"]
            ) == ("http://127.0.0.1:4321/v1", "qwen3:8b", 32768)
