"""The one settings schema: flag over variable over config file over default, each bad value
named where it was written, and every command's flags built from it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer.main

from localinfer.backends.base import LoadOptions
from localinfer.cli import commands
from localinfer.errors import InvalidRequest
from localinfer.settings import KvType, Settings, SettingsError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path))
    for name in ("LOCALINFER_CONFIG", "LOCALINFER_PORT", "LOCALINFER_CTX",
                 "LOCALINFER_DEFAULT_CTX", "LOCALINFER_THREADS", "LOCALINFER_KV_TYPE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_flag_over_variable_over_config_file_over_default(home, monkeypatch):
    assert Settings.read().port == 11435
    (home / "config.toml").write_text('port = 12000\nkv_type = "q8_0"\nthreads = 3\n')
    assert Settings.read().port == 12000 and Settings.read().kv_type is KvType.Q8_0
    monkeypatch.setenv("LOCALINFER_PORT", "13000")
    assert Settings.read().port == 13000
    assert Settings.read({"port": 14000, "threads": None}).port == 14000  # None: not given
    assert Settings.read({"threads": None}).threads == 3


def test_a_context_variable_keeps_its_old_name_below_the_new(home, monkeypatch):
    monkeypatch.setenv("LOCALINFER_DEFAULT_CTX", "512")
    assert Settings.read().ctx == 512
    monkeypatch.setenv("LOCALINFER_CTX", "1024")
    assert Settings.read().ctx == 1024


@pytest.mark.parametrize("text, said", [
    ("prot = 1\n", "no setting is called 'prot'"),
    ("port = 'x'\n", "port = 'x': Input should be a valid integer"),
    ("port = [\n", "is not TOML"),
    ("home = '/elsewhere'\n", "use LOCALINFER_HOME"),
])
def test_a_bad_config_file_is_named_with_what_to_fix(home, text, said):
    (home / "config.toml").write_text(text)
    with pytest.raises(SettingsError, match=str(home / "config.toml")) as caught:
        Settings.read()
    assert said in str(caught.value)


def test_a_bad_value_is_named_where_it_was_written(home, monkeypatch):
    with pytest.raises(SettingsError, match="^--parallel 0: "):
        Settings.read({"parallel": 0})
    monkeypatch.setenv("LOCALINFER_PARALLEL", "0")
    with pytest.raises(SettingsError, match="^LOCALINFER_PARALLEL='0': .* unset that variable"):
        Settings.read()
    monkeypatch.setenv("LOCALINFER_CONFIG", str(home / "absent.toml"))
    with pytest.raises(SettingsError, match="LOCALINFER_CONFIG names"):
        Settings.read()


def test_load_options_come_from_the_settings(home, monkeypatch):
    (home / "config.toml").write_text("max_tokens = 7\nkv_unified = true\n")
    monkeypatch.setenv("LOCALINFER_THREADS", "3")
    monkeypatch.setenv("LOCALINFER_KV_TYPE", "q4_0")
    monkeypatch.setenv("LOCALINFER_CTX_CHECKPOINTS", "4")
    monkeypatch.setenv("LOCALINFER_CTX_CHECKPOINT_MIB", "64")
    options = LoadOptions.from_settings(Settings.read({"draft": 5}), n_slots=2)
    assert (options.n_threads, options.kv_type, options.reply_cap, options.kv_unified,
            options.draft_tokens, options.n_slots, options.n_ctx, options.ctx_checkpoints,
            options.ctx_checkpoint_mib) == (
        3, KvType.Q4_0, 7, True, 5, 2, None, 4, 64)  # n_ctx None: the setting, within the model's
    assert LoadOptions.from_settings(Settings.read({"ctx_checkpoints": 0})).ctx_checkpoints == 0
    assert Settings.model_fields["ctx_checkpoint_mib"].default == LoadOptions().ctx_checkpoint_mib
    with pytest.raises(InvalidRequest, match="MiB per slot"):
        LoadOptions(ctx_checkpoint_mib=0)


def test_every_setting_flag_shows_the_schema_default_and_variable():
    """Flags are built from the fields: each flag that names a LOCALINFER_ variable names a
    field, with that field's bounds, and serve offers every per-model and server setting."""
    command = typer.main.get_command(commands)
    fields = Settings.model_fields
    seen = set()
    for name, sub in command.commands.items():
        for param in sub.params:
            built = re.search(r"LOCALINFER_([A-Z_]+)\]$", getattr(param, "help", "") or "")
            if not built:  # a command's own argument, not a setting
                continue
            field = built.group(1).lower()
            assert field in fields, (name, param.name)
            seen.add(field)
            low = next((m.ge for m in fields[field].metadata if hasattr(m, "ge")), None)
            if low is not None:
                assert param.min == low, (name, param.name)
    only_elsewhere = {"home", "default_model", "runner_timeout", "load_timeout",
                      "max_body_bytes", "header_timeout", "body_timeout",
                      "worker_key"}  # (a secret: never on a command line)
    assert seen == set(fields) - only_elsewhere


def test_status_commands_read_the_config_file(home):
    """`ps` finds the server where the config file says (one line, no traceback)."""
    (home / "config.toml").write_text("port = 1\n")
    result = subprocess.run([sys.executable, "-m", "localinfer", "ps"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "http://127.0.0.1:1 " in result.stderr


def test_a_config_file_too_big_to_be_one_is_refused(home):
    (home / "config.toml").write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(SettingsError, match="over 1 MiB"):
        Settings.read()


@pytest.mark.parametrize("host, alone", [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("192.0.2.1", False), ("no-such-host.invalid", False),
])
def test_a_host_binds_this_machine_alone_only_where_every_address_it_names_is_loopback(
        host, alone):
    """`serve` and `worker` ask for a key unless they listen on this machine alone: what
    the host resolves to, as the bind resolves it, not what its name looks like."""
    from localinfer.settings import binds_loopback

    assert binds_loopback(host) is alone
