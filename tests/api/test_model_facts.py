"""What the Ollama API says of a model through the unmodified `ollama` client: its
capabilities as they are, and the context a request asks for (num_ctx) honoured."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import ollama
import pytest

from ..families import install
from .conftest import start_server, stop_server

TOOLS_TEMPLATE = ("{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
                  "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                  "{% endfor %}")


def _install(home: Path, name: str, arch: str, template: str | None,
             extra: dict | None = None) -> str:
    """A pulled model of one small tensor with this header (describing a model reads only
    its header: it is never loaded here)."""
    path = home / "made" / f"{name}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(512)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    writer.add_token_list([f"t{i}" for i in range(8)])
    if template:
        writer.add_chat_template(template)
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return install(home, path, name)


@pytest.mark.slow
def test_capabilities_say_what_each_model_does_and_num_ctx_reloads_it(tmp_path):
    home = tmp_path / "home"
    with_tools = _install(home, "chat-with-tools", "llama", TOOLS_TEMPLATE)
    embedder = _install(home, "embedder", "bert", None, {"bert.pooling_type": 1})
    server = start_server(home, "--model", "smollm2:135m", "--ctx", "256", "--parallel", "1")
    try:
        client = ollama.Client(host=server.url)
        # smollm2's template knows no tools; gemma3's neither; a template that writes them
        assert client.show("smollm2:135m").capabilities == ["completion"]
        assert client.show("gemma3:270m").capabilities == ["completion"]
        assert client.show(with_tools).capabilities == ["completion", "tools"]
        assert client.show(embedder).capabilities == ["embedding"]

        long = "Tell me about the sea. " * 120  # ~700 tokens: more than 256
        with pytest.raises(ollama.ResponseError, match="256"):
            client.generate(model="smollm2:135m", prompt=long, options={"num_predict": 2})
        reply = client.generate(model="smollm2:135m", prompt=long,
                                options={"num_predict": 2, "num_ctx": 1024})
        assert reply.prompt_eval_count > 256 and reply.eval_count >= 1
        assert [m.context_length for m in client.ps().models] == [1024]
        # beyond what the model was trained on: what it was trained on (as Ollama)
        client.generate(model="smollm2:135m", prompt="Hi",
                        options={"num_predict": 1, "num_ctx": 1 << 20})
        assert [m.context_length for m in client.ps().models] == [8192]
        # none asked: the server's own is less, and the larger one loaded serves it as it is
        again = client.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 1})
        assert [m.context_length for m in client.ps().models] == [8192]
        assert again.load_duration == 0
    finally:
        stop_server(server)


@pytest.mark.slow
def test_a_num_ctx_that_grows_each_turn_is_not_a_load_each_turn(tmp_path):
    """aider sends num_ctx with every message, its prompt's tokens × 1.25 + 8,192: a little
    more each turn. Ollama loads the model again for each; here a context that must grow
    for a client grows to the next power of two, and what the loaded context holds is
    served as it is, so only a context past it is a load. A smaller one asked later (or
    none) never shrinks it. On the CPU, where a smaller context would put no more of the
    model on a GPU."""
    server = start_server(tmp_path / "home", "--model", "smollm2:135m", "--ctx", "256",
                          "--parallel", "1")
    try:
        client = ollama.Client(host=server.url)

        def turn(num_ctx: int | None) -> tuple[int, bool]:
            options = {"num_predict": 1} | ({"num_ctx": num_ctx} if num_ctx else {})
            reply = client.chat(model="smollm2:135m", options=options,
                                messages=[{"role": "user", "content": "Hi"}])
            context, = [m.context_length for m in client.ps().models]
            return context, reply.load_duration > 0

        assert turn(None) == (256, False)  # the server's own, loaded as it started
        assert turn(1100) == (2048, True)  # grown past it: with room to spare
        assert [turn(n) for n in (1400, 2048, 300, None)] == [(2048, False)] * 4
        assert turn(2049) == (4096, True)
        assert turn(6000) == (8192, True)  # (the next power of two is what it was trained on)
        assert turn(1 << 20) == (8192, False)
    finally:
        stop_server(server)
