import pytest

from localinfer.backends.chat_template import ChatTemplate, fallback_template
from localinfer.errors import InvalidRequest


def test_gemma_fallback_folds_system_into_first_user_turn():
    t = ChatTemplate(fallback_template("gemma3"), bos_token="<bos>")
    text = t.render([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ])
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_chatml_fallback_for_other_architectures():
    t = ChatTemplate(fallback_template("qwen2"))
    assert t.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_sandbox_refuses_python_internals():
    t = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(InvalidRequest, match="unsafe|failed"):
        t.render([{"role": "user", "content": "x"}])


def test_raise_exception_from_template_becomes_a_request_error():
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        t.render([{"role": "user", "content": "x"}])


def test_unknown_role_and_broken_template():
    with pytest.raises(InvalidRequest, match="role"):
        ChatTemplate(fallback_template("llama")).render([{"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidRequest, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
