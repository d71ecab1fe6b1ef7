"""The web chat app in a real browser (Debian's chromium, driven by Playwright), on
`localinfer app` as a user starts it: a real server in-process, the real models.

Screenshots land in build/screenshots/ for a person to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ..fake_hub import FakeHub
from ..families import family_model, install

HUB_REPO = "testorg/SmolLM2-135M-Instruct-GGUF"
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
CHROMIUM = os.environ.get("LOCALINFER_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser")
# chromium's own calls home are refused on a closed network, many at a time: turn them off
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("LOCALINFER_REQUIRE_BROWSER"):
            pytest.fail("no chromium: install it (apt-get install chromium)")
        pytest.skip("no chromium on this machine: apt-get install chromium to run the "
                    "browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def hub(smollm2_path):
    """A fake hub over real HTTP with one repo to pull from."""
    hub = FakeHub()
    hub.add(HUB_REPO, "SmolLM2-135M-Instruct-Q4_1.gguf", smollm2_path)
    yield hub.start()
    hub.stop()


@pytest.fixture(scope="module")
def desktop_app(tmp_path_factory, hub):
    """`localinfer app --no-browser`: the page's address with this launch's key, from the
    launch file the app names (the key itself is never printed)."""
    home = tmp_path_factory.mktemp("app-home")
    # a thinking model: DeepSeek-R1's template opens the reasoning block itself, so what a
    # random-weight model writes streams as reasoning
    install(home, family_model("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), "r1-tiny")
    env = {**os.environ, "LOCALINFER_HOME": str(home), "LOCALINFER_MAX_TOKENS": "24",
           "HF_ENDPOINT": hub.url, "HF_HOME": str(home / "hf"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("LOCALINFER_API_KEY", None)
    process = subprocess.Popen([sys.executable, "-m", "localinfer", "app", "--no-browser",
                                "--ctx", "512", "--parallel", "2"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, page = time.monotonic() + 60, None
    while page is None and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        found = re.search(r"open file://(\S+)", line)
        page = (re.search(r'"(http://127\.0\.0\.1:\d+/#key=[^"]+)"',
                          Path(found.group(1)).read_text()).group(1) if found else None)
    if page is None:
        process.kill()
        pytest.fail(f"localinfer app did not print its address:\n{process.stdout.read()}")
    yield page
    process.terminate()
    assert process.wait(timeout=20) == 0


# Playwright's wait_for_function evaluates its predicate with eval, which the page's own
# policy forbids, as it should; these contexts bypass it (the policy has a test of its own)
WAITS = {"bypass_csp": True}


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _ask(page, text: str, replies: int) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_function(
        f"document.querySelectorAll('.message.assistant').length === {replies} && "
        "document.querySelector('#stop').hidden", timeout=60_000)


def test_chat_switch_model_and_find_the_chat_after_a_reload(browser, desktop_app):
    context = browser.new_context(viewport={"width": 1200, "height": 800}, **WAITS)
    page = context.new_page()
    page.goto(desktop_app)
    assert "#key=" not in page.url  # the key leaves the address bar at once
    page.wait_for_function("document.querySelector('#model').value === 'smollm2:135m'")
    assert page.text_content("#fit") == "CPU"
    options = page.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    assert "gemma3:270m" in options and "llama3.2:3b" in options  # installed, and to pull

    # count the reply's redraws while it streams
    page.evaluate("""() => { window.draws = 0; new MutationObserver(() => window.draws++)
        .observe(document.querySelector('#messages'), {subtree: true, childList: true,
                                                       characterData: true}); }""")
    _ask(page, "Name three colours.", replies=1)
    reply = page.locator(".message.assistant").last
    assert reply.locator(".content").inner_text().strip()
    figures = reply.locator(".figures").inner_text()
    shown = re.search(r"TTFT \d[\d,]* ms · [\d.]+ tok/s · prompt \d+ tok @ [\d.]+ tok/s · "
                      r"(\d+) tok", figures)
    assert shown and 1 < int(shown.group(1)) <= 24, figures  # the engine's numbers; the cap
    assert page.evaluate("window.draws") > 3, "the reply should appear piece by piece"
    # the live figures are the engine's definitions on the page's clock: 4 pieces after the
    # first in 2 s is 2 tok/s, however long ago the last one came
    live = page.evaluate("async () => (await import('/ui/app.js')).liveFigures(0, 500, 2500, 5)")
    assert live == {"ttft_ms": 500, "decode_tps": 2}
    assert "tok/s" in page.text_content("#status")
    _shot(page, "web-chat")

    page.select_option("#model", "gemma3:270m")
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('gemma3:270m ready')", timeout=60_000)
    _ask(page, "The capital of France is", replies=2)
    assert "gemma3:270m" in page.locator(".message.assistant .who").last.inner_text()

    page.reload()
    page.wait_for_selector("#chats li")
    assert page.locator("#chats li").count() == 1
    assert page.locator("#chats li a").inner_text() == "Name three colours."
    assert page.locator(".message").count() == 4
    assert "TTFT" in page.locator(".message.assistant .figures").first.inner_text()
    page.wait_for_function("document.querySelector('#model').value === 'gemma3:270m'")
    _shot(page, "web-after-reload")
    context.close()


def test_a_reply_can_neither_fetch_a_url_nor_show_a_form(browser, desktop_app):
    """A reply's Markdown image made the browser fetch its URL with no click (data in the
    query), and a <form> survived the sanitizer. A model may repeat what a page told it.
    The image points at a server of our own on another port, which counts what reaches it."""
    import http.server
    import threading

    hits: list[str] = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    leak = f"http://127.0.0.1:{other.server_address[1]}/x.png?data=secret"
    base, key = desktop_app.split("/#", 1)
    # the page is served at / and, as a file, at /ui/index.html: the same policy at both
    for path in ("/", "/ui/index.html", "/ui/app.js"):
        headers = httpx.get(base + path, headers={"Accept": "text/html"}, timeout=30).headers
        assert "img-src 'self' data:" in headers["content-security-policy"], path
        assert headers["x-frame-options"] == "DENY", path
    reply = (f"![x]({leak})\n\n<form action='{leak}'><input name='q'>"
             f"<button>Send</button></form><p style='color: red'>styled</p>")
    chat = {"id": "c1", "title": "Crafted", "model": "smollm2:135m", "system": "", "params": {},
            "updated": 1, "messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": reply}]}
    try:
        for address in (desktop_app, f"{base}/ui/index.html#{key}"):
            context = browser.new_context()
            page = context.new_page()
            try:
                page.goto(address)
                page.evaluate("c => localStorage.setItem('localinfer.chats.v1', "
                              "JSON.stringify([c]))", chat)
                page.reload()
                page.click("#chats li a")
                page.wait_for_selector(".message.assistant img")
                content = page.locator(".message.assistant .content")
                assert content.locator("form, input, button").count() == 0
                assert content.locator("[style]").count() == 0 and "styled" in content.inner_text()
                page.wait_for_timeout(500)  # time for a fetch to arrive, were it allowed
                assert hits == [], address
            finally:
                context.close()
    finally:
        other.shutdown()


def test_without_the_launch_key_the_page_gets_nothing(browser, desktop_app):
    context = browser.new_context(**WAITS)
    page = context.new_page()
    page.goto(desktop_app.split("#", 1)[0])
    page.wait_for_function("document.querySelector('#status').textContent.includes('API key')")
    assert page.locator("#model option").count() == 0
    context.close()


def test_rename_and_export_a_conversation(browser, desktop_app, tmp_path):
    context = browser.new_context(accept_downloads=True, **WAITS)
    page = context.new_page()
    page.goto(desktop_app)
    page.wait_for_function("document.querySelector('#model').value === 'smollm2:135m'")
    _ask(page, "Say hello.", replies=1)

    page.once("dialog", lambda dialog: dialog.accept("  Greetings   test "))
    page.click("#chats li button[title='Rename this conversation']")
    assert page.locator("#chats li a").inner_text() == "Greetings test"
    page.once("dialog", lambda dialog: dialog.accept(""))  # nothing typed: the title stays
    page.click("#chats li button[title='Rename this conversation']")
    assert page.locator("#chats li a").inner_text() == "Greetings test"

    with page.expect_download() as download:
        page.click("#export")
    assert download.value.suggested_filename == "Greetings test.md"
    saved = tmp_path / "export.md"
    download.value.save_as(saved)
    text = saved.read_text()
    reply = page.locator(".message.assistant .content").inner_text().strip()
    assert text.startswith("# Greetings test\n\nModel: `smollm2:135m`\n\n## You\n\nSay hello.\n")
    assert "## Assistant\n" in text and reply.split()[0] in text

    page.reload()  # the new title was saved with the conversation
    page.wait_for_selector("#chats li")
    assert page.locator("#chats li a").inner_text() == "Greetings test"
    context.close()


def test_remove_a_pulled_model_but_not_an_embedded_one(browser, desktop_app):
    base, key = desktop_app.split("/#key=")
    pulled = f"hf.co/{HUB_REPO}:Q4_1"
    done = httpx.post(f"{base}/api/pull", json={"model": pulled, "stream": False},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert done.status_code == 200, done.text
    context = browser.new_context(**WAITS)
    page = context.new_page()
    page.goto(desktop_app)
    page.wait_for_function("document.querySelector('#model').value === 'smollm2:135m'")
    assert page.locator("#remove-model").is_hidden()  # ships with localinfer
    installed = "#model optgroup[label='On this machine'] option"
    assert pulled in page.eval_on_selector_all(installed, "os => os.map(o => o.value)")

    page.select_option("#model", pulled)
    page.wait_for_function(f"document.querySelector('#status').textContent === '{pulled} ready'",
                           timeout=60_000)
    page.once("dialog", lambda dialog: dialog.dismiss())  # changed their mind: nothing happens
    page.click("#remove-model")
    assert pulled in page.eval_on_selector_all(installed, "os => os.map(o => o.value)")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#remove-model")
    page.wait_for_function(f"document.querySelector('#status').textContent === '{pulled} deleted'")
    assert pulled not in page.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    assert page.input_value("#model") == "smollm2:135m"
    tags = httpx.get(f"{base}/api/tags", headers={"Authorization": f"Bearer {key}"}).json()
    assert pulled not in [m["name"] for m in tags["models"]]
    context.close()


def test_a_thinking_models_reasoning_streams_into_a_folded_block(browser, desktop_app):
    context = browser.new_context(viewport={"width": 1200, "height": 800}, **WAITS)
    page = context.new_page()
    page.goto(desktop_app)
    page.wait_for_function("document.querySelector('#model').value !== ''")
    page.select_option("#model", "hf.co/testorg/r1-tiny:Q8_0")
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('r1-tiny:Q8_0 ready')", timeout=60_000)
    page.evaluate("""() => { window.opened = false; new MutationObserver(() => {
        if (document.querySelector('.message.assistant .reasoning[open]')) window.opened = true;
      }).observe(document.querySelector('#messages'), {subtree: true, attributes: true,
                                                       childList: true}); }""")
    replies = page.locator(".message.assistant").count()
    _ask(page, "Hi", replies=replies + 1)
    reply = page.locator(".message.assistant").last
    block = reply.locator(".reasoning")
    assert block.is_visible() and block.locator(".thought").text_content().strip()
    assert page.evaluate("window.opened"), "open while the model thinks"
    assert block.get_attribute("open") is None, "folded once the reply is done"
    assert "reasoning)" in reply.locator(".figures").inner_text()
    _shot(page, "web-reasoning")
    page.reload()
    page.wait_for_selector(".message.assistant .reasoning")
    kept = page.locator(".message.assistant").last.locator(".reasoning .thought")
    assert kept.text_content().strip(), "the reasoning is kept with the conversation"
    context.close()
