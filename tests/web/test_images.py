"""Pictures in the web chat app, in a real browser (Debian's chromium, driven by Playwright)
on a real `localinfer serve`: Gemma 3 270M with a random-weight Gemma 3 projector (every
picture is 64 image tokens, as in tests/api/test_vision.py), and smollm2, which takes none.
The replies are noise; what is tested is that an attached picture reaches the model (its
tokens in the reply's prompt count, its `image_url` part in the request), is shown and kept
with the conversation as a thumbnail, and is refused with one line where it cannot go."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest
from PIL import Image

from ..api.conftest import start_server, stop_server
from ..families import install, projector
from . import test_browser
from .test_browser import WAITS, _shot

browser = test_browser.browser  # the same chromium fixture, one for this module

pytestmark = pytest.mark.slow

IMAGE_TOKENS = 64
TEXT_MODEL = "smollm2:135m"


@pytest.fixture(scope="module")
def vision(tmp_path_factory, gemma3_path):
    home = tmp_path_factory.mktemp("web-vision-home")
    name = install(home, gemma3_path, "gemma3-vision", projector(gemma3_path, IMAGE_TOKENS))
    server = start_server(home, "--model", name, "--ctx", "2048", "--parallel", "2",
                          env={"LOCALINFER_MAX_TOKENS": "4"}, ready_timeout=120)
    yield server, name
    stop_server(server)


def _png(colour: tuple[int, int, int], size: tuple[int, int] = (320, 240)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def _picture(url: str) -> Image.Image:
    assert url.startswith("data:image/jpeg;base64,"), url[:40]
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def _open(browser, vision, text_model: bool = False):
    """A fresh page (its own localStorage) on the vision model, or on smollm2, once the page
    knows whether the model takes pictures."""
    server, name = vision
    context = browser.new_context(viewport={"width": 1200, "height": 800}, **WAITS)
    page = context.new_page()
    with page.expect_response("**/api/show"):
        page.goto(server.url + "/")
    page.wait_for_function(f"document.querySelector('#model').value === '{name}'")
    if text_model:
        with page.expect_response(lambda r: r.url.endswith("/api/show")
                                  and TEXT_MODEL in (r.request.post_data or "")):
            page.select_option("#model", TEXT_MODEL)
        page.wait_for_function("document.querySelector('#status').textContent"
                               f".includes('{TEXT_MODEL} ready')", timeout=60_000)
    return context, page


def _drop(page, files: list[tuple[str, str, bytes]], target: str = "#messages") -> None:
    """Files dropped on `target` as a file manager drops them: a DataTransfer of Files."""
    page.evaluate("""([files, target]) => {
        const dt = new DataTransfer();
        for (const [name, type, b64] of files) {
          const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
          dt.items.add(new File([bytes], name, { type }));
        }
        const element = document.querySelector(target);
        for (const kind of ["dragenter", "dragover", "drop"]) {
          element.dispatchEvent(new DragEvent(kind, { dataTransfer: dt, bubbles: true,
                                                      cancelable: true }));
        }
      }""", [[[n, t, base64.b64encode(b).decode()] for n, t, b in files], target])


def _paste(page, file: tuple[str, str, bytes]) -> None:
    """A picture pasted into the prompt from the clipboard."""
    page.evaluate("""([name, type, b64]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], name,
                              { type }));
        document.querySelector("#prompt").dispatchEvent(new ClipboardEvent("paste", {
          clipboardData: dt, bubbles: true, cancelable: true }));
      }""", [file[0], file[1], base64.b64encode(file[2]).decode()])


def _send(page, text: str) -> dict:
    """Send the message and wait for the reply: the request the page made, as JSON."""
    replies = page.locator(".message.assistant").count()
    with page.expect_request("**/v1/chat/completions") as request:
        page.fill("#prompt", text)
        page.press("#prompt", "Enter")
    page.wait_for_function(
        f"document.querySelectorAll('.message.assistant').length === {replies + 1} && "
        "document.querySelector('#stop').hidden", timeout=60_000)
    return request.value.post_data_json


def _prompt_tokens(page) -> int:
    figures = page.locator(".message.assistant .figures").last.inner_text()
    found = re.search(r"prompt (\d+) tok", figures)
    assert found, figures
    return int(found.group(1))


def _image_parts(message: dict) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return []
    return [p["image_url"]["url"] for p in content if p["type"] == "image_url"]


def test_pictures_attached_by_picker_drop_or_paste_reach_the_model_and_survive_a_reload(
        browser, vision, tmp_path):
    context, page = _open(browser, vision)
    assert page.is_enabled("#attach")
    _send(page, "What is this?")
    text_only = _prompt_tokens(page)

    page.click("#new-chat")
    large = tmp_path / "large-red.png"
    large.write_bytes(_png((200, 30, 30), (1600, 1200)))
    page.set_input_files("#attach-input", str(large))
    page.wait_for_selector("#attachments .chip img")
    _drop(page, [("blue.png", "image/png", _png((30, 30, 200)))])
    page.wait_for_function("document.querySelectorAll('#attachments .chip').length === 2")
    _paste(page, ("green.png", "image/png", _png((30, 200, 30))))
    page.wait_for_function("document.querySelectorAll('#attachments .chip').length === 3")
    assert page.is_visible("#attachments")
    _shot(page, "web-attachments")
    page.click("#attachments .chip:last-child button")  # pasted: changed their mind
    assert page.locator("#attachments .chip").count() == 2
    assert page.get_attribute("#attachments .chip:first-child img", "title") == "large-red.png"

    sent = _send(page, "What is this?")
    question = sent["messages"][-1]
    pictures = _image_parts(question)
    assert len(pictures) == 2, question
    assert {"type": "text", "text": "What is this?"} in question["content"]
    assert _picture(pictures[0]).size == (1024, 768)  # scaled in the browser to 1,024 px
    assert _picture(pictures[1]).size == (320, 240)  # (a small one as it was)
    # both pictures were read into the prompt: 64 tokens each, and the marks around them
    assert _prompt_tokens(page) >= text_only + 2 * IMAGE_TOKENS
    assert page.locator("#attachments .chip").count() == 0 and page.is_hidden("#attachments")
    assert page.locator(".message.user").last.locator(".pictures img").count() == 2
    _shot(page, "web-pictures")

    page.reload()
    page.wait_for_selector(".message.user .pictures img")
    kept = page.eval_on_selector_all(".message.user .pictures img", "is => is.map(i => i.src)")
    assert len(kept) == 2
    for url in kept:  # the thumbnails the conversation keeps in localStorage
        assert max(_picture(url).size) <= 256 and len(url) <= 48 * 1024
    stored = json.loads(page.evaluate("localStorage.getItem('localinfer.chats.v1')"))
    chat = next(c for c in stored if any(m.get("images") for m in c["messages"]))
    assert chat["messages"][0]["images"] == kept
    page.wait_for_function("document.querySelector('#model').value !== ''")
    # a later turn sends the earlier pictures again, as kept
    again = _send(page, "And its colour?")
    assert _image_parts(again["messages"][0]) == kept
    assert _image_parts(again["messages"][-1]) == []
    assert _prompt_tokens(page) >= 2 * IMAGE_TOKENS
    context.close()


def test_a_file_that_is_not_a_picture_is_refused_with_one_line(browser, vision):
    context, page = _open(browser, vision)
    page.set_input_files("#attach-input", files=[
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a picture"}])
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('is not a picture')")
    assert "notes.txt" in page.text_content("#status")
    assert page.locator("#attachments .chip").count() == 0
    # dropped, with a picture's name and type but not a picture's bytes
    _drop(page, [("fake.png", "image/png", b"\x89PNG\r\n\x1a\n not really")], target="#prompt")
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('could not be read as a picture')")
    assert page.locator("#attachments .chip").count() == 0
    _shot(page, "web-not-a-picture")
    context.close()


def test_a_text_only_model_offers_no_attachment_and_says_why(browser, vision):
    context, page = _open(browser, vision)
    _drop(page, [("red.png", "image/png", _png((200, 30, 30)))])
    page.wait_for_selector("#attachments .chip")
    # a picture waiting when the model is changed to one that takes none stays, unsent
    with page.expect_response(lambda r: r.url.endswith("/api/show")
                              and TEXT_MODEL in (r.request.post_data or "")):
        page.select_option("#model", TEXT_MODEL)
    page.wait_for_function("document.querySelector('#attach').disabled")
    assert "takes no pictures" in page.get_attribute("#attach", "title")
    page.fill("#prompt", "What is this?")
    page.press("#prompt", "Enter")
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('takes no pictures — remove them')")
    assert page.locator(".message").count() == 0 and page.input_value("#prompt")
    page.click("#attachments .chip button")
    _drop(page, [("blue.png", "image/png", _png((30, 30, 200)))])
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('takes no pictures — pick a vision model')")
    assert page.locator("#attachments .chip").count() == 0
    _shot(page, "web-text-model-no-pictures")

    # a conversation with a picture, continued on the text model: the server's own 400
    thumb = "data:image/png;base64," + base64.b64encode(_png((9, 9, 9), (64, 48))).decode()
    chat = {"id": "c1", "title": "A picture", "model": TEXT_MODEL, "system": "", "params": {},
            "updated": 1, "messages": [
                {"role": "user", "content": "What is this?", "images": [thumb]},
                {"role": "assistant", "content": "Noise."}]}
    page.evaluate("c => localStorage.setItem('localinfer.chats.v1', JSON.stringify([c]))", chat)
    page.reload()
    page.wait_for_selector(".message.user .pictures img")
    page.wait_for_function(f"document.querySelector('#model').value === '{TEXT_MODEL}'")
    page.fill("#prompt", "And its colour?")
    page.press("#prompt", "Enter")
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('takes no images')", timeout=60_000)
    assert page.text_content("#status").startswith(f"Reply failed: {TEXT_MODEL} takes no images")
    assert page.input_value("#prompt") == "And its colour?"  # the question back to edit
    assert page.locator(".message").count() == 2
    context.close()


def test_storage_keeps_thumbnails_under_its_cap_and_says_when_it_is_full(
        browser, vision):
    context, page = _open(browser, vision)
    # an older conversation holding 2.3 MB of thumbnails: over the 2 MB cap for pictures
    filler = "data:image/jpeg;base64," + "A" * (48 * 1024 - 24)  # (whole base64 quads)
    old = {"id": "old", "title": "Old pictures", "model": vision[1], "system": "",
           "params": {}, "updated": 1, "messages": [
               {"role": "user", "content": f"picture {i}", "images": [filler]}
               for i in range(48)]}
    page.evaluate("c => localStorage.setItem('localinfer.chats.v1', JSON.stringify([c]))", old)
    page.reload()
    page.wait_for_function(f"document.querySelector('#model').value === '{vision[1]}'")
    page.click("#new-chat")
    _drop(page, [("red.png", "image/png", _png((200, 30, 30)))])
    page.wait_for_selector("#attachments .chip")
    _send(page, "")  # a picture alone, no words
    status = page.text_content("#status")
    assert "older pictures were removed from this browser's storage" in status, status
    stored = json.loads(page.evaluate("localStorage.getItem('localinfer.chats.v1')"))
    kept = [url for c in stored for m in c["messages"] for url in m.get("images", []) if url]
    assert sum(map(len, kept)) <= 2 * 2 ** 20
    new = next(c for c in stored if c["id"] != "old")
    assert new["title"] == "Picture" and new["messages"][0]["content"] == ""
    assert new["messages"][0]["images"][0].startswith("data:image/jpeg")  # the new one stays
    gone = next(c for c in stored if c["id"] == "old")["messages"]
    assert gone[0]["images"] == [None] and gone[-1]["images"] == [filler]  # oldest first
    page.click("#chats li:last-child a")
    assert page.locator(".message.user").first.locator(".gone").inner_text() == \
        "picture not kept in this browser"

    # storage full: the conversation stays on the page, and the page says it is not saved
    page.click("#new-chat")
    page.evaluate("""() => {
        for (let size = 1 << 20, i = 0; size >= 1024; ) {
          try { localStorage.setItem(`filler-${i++}`, "x".repeat(size)); }
          catch { size >>= 1; }
        }
      }""")
    _send(page, "Hello?")
    page.wait_for_function("document.querySelector('#status').textContent"
                           ".includes('storage is full')")
    assert page.locator(".message").count() == 2
    _shot(page, "web-storage-full")
    context.close()
