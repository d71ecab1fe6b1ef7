import pytest

from localinfer.chat_formats.template import ChatTemplate, fallback_template
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


# ------------------------------------------------ a hostile template (it comes with the file)
HI = [{"role": "user", "content": "Hi"}]
SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("source,message", [
    ("{{ 'x' * 10**10 }}", "repeated a value 10,000,000,000 times"),  # took 10 GB
    ("{{ [1, 2] * 10**9 }}", "repeated a value"),
    ("{{ 7 ** (10 ** 8) }}", "to the power 100,000,000"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}{{ ns.s }}", "built a value of"),
    ("{% for i in range(100000) %}{{ messages[0].content * 30000 }}{% endfor %}",
     "wrote more than 16,777,216 characters"),
    (SPIN, "ran for more than 0.2 s"),  # ran for ever
    ("{% for a in messages %}{% for b in messages %}{% endfor %}{% endfor %}",
     "ran for more than 0.2 s"),
    ("{% set s = 'x' * 2500 %}{% for a in s %}{% for b in s %}{% for c in s %}{% endfor %}"
     "{% endfor %}{% endfor %}", "ran for more than 0.2 s"),  # read and wrote nothing: minutes
    ("{% for i in range(10**9) %}{% endfor %}", "asked too much"),  # an OverflowError
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses without end"),
    ("{{ messages[0].content + 5 }}", "failed to render: TypeError"),
])
def test_a_costly_or_broken_template_is_one_clear_error(monkeypatch, source, message):
    from localinfer.chat_formats import template as chat_template

    monkeypatch.setattr(chat_template, "MAX_SECONDS", 0.2)
    messages = HI * 100_000 if "for a in messages" in source else HI
    with pytest.raises(InvalidRequest, match=message.replace("*", r"\*")):
        ChatTemplate(source).render(messages)
    assert ChatTemplate("{{ messages[0].content }}").render(HI) == "Hi"  # the next one works


def test_loop_controls_work_as_in_hugging_face_templates():
    t = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                     "{{ m.content }}{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}")
    assert t.render([{"role": "system", "content": "S"}] + HI * 5) == "HiHi"
