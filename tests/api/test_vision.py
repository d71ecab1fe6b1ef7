"""Images in, through the unmodified `openai` and `ollama` clients: Gemma 3 270M with a
random-weight Gemma 3 projector (bench/random_mmproj.py: every picture becomes 64 image
tokens, encoded by llama.cpp's libmtmd), installed as a pulled model with its projector.
The answers are noise; what is tested is that an image is read into the prompt as its
tokens, cached as a prefix when the same picture comes again, and refused cleanly when it
is bad or the model takes none."""

from __future__ import annotations

import base64
import io

import httpx
import ollama
import openai
import pytest
from PIL import Image

from ..families import install, projector
from .conftest import start_server, stop_server

pytestmark = pytest.mark.slow

IMAGE_TOKENS = 64


@pytest.fixture(scope="module")
def vision(tmp_path_factory, gemma3_path):
    home = tmp_path_factory.mktemp("vision-home")
    name = install(home, gemma3_path, "gemma3-vision", projector(gemma3_path, IMAGE_TOKENS))
    server = start_server(home, "--model", name, "--ctx", "2048", "--parallel", "2",
                          ready_timeout=120)
    yield server, name
    stop_server(server)


def _png(colour: tuple[int, int, int], size: tuple[int, int] = (320, 240)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _ask(client: openai.OpenAI, name: str, *images: bytes, text: str = "What is this?"):
    content = [{"type": "image_url", "image_url": {"url": _data_url(i)}} for i in images]
    return client.chat.completions.create(
        model=name, max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": [*content, {"type": "text", "text": text}]}])


def test_openai_client_asks_about_a_picture_and_the_same_one_is_cached(vision):
    server, name = vision
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    text_only = client.chat.completions.create(
        model=name, max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": "What is this?"}])
    red = _ask(client, name, _png((200, 30, 30)))
    assert red.choices[0].message.content is not None
    # the picture's tokens, and the family's marks around it (<start_of_image>, <end_of_image>)
    extra = red.usage.prompt_tokens - text_only.usage.prompt_tokens
    assert IMAGE_TOKENS <= extra <= IMAGE_TOKENS + 4
    again = _ask(client, name, _png((200, 30, 30)), text="And its colour?")
    assert again.usage.prompt_tokens_details.cached_tokens >= IMAGE_TOKENS
    blue = _ask(client, name, _png((30, 30, 200)), text="And its colour?")
    assert blue.usage.prompt_tokens_details.cached_tokens < IMAGE_TOKENS // 2
    two = _ask(client, name, _png((200, 30, 30)), _png((30, 30, 200)))
    assert two.usage.prompt_tokens - text_only.usage.prompt_tokens >= 2 * IMAGE_TOKENS


def test_ollama_client_sends_images_to_chat_and_generate(vision):
    server, name = vision
    client = ollama.Client(host=server.url)
    picture = _png((20, 160, 40))
    reply = client.chat(model=name, options={"num_predict": 4, "temperature": 0},
                        messages=[{"role": "user", "content": "What is this?",
                                   "images": [picture]}])
    plain = client.chat(model=name, options={"num_predict": 4, "temperature": 0},
                        messages=[{"role": "user", "content": "What is this?"}])
    assert reply.prompt_eval_count >= plain.prompt_eval_count + IMAGE_TOKENS
    parts = list(client.generate(model=name, prompt="Describe it.", images=[picture],
                                 options={"num_predict": 4}, stream=True))
    assert parts[-1].done and parts[-1].prompt_eval_count > IMAGE_TOKENS
    assert "vision" in client.show(name).capabilities
    assert "vision" not in client.show("smollm2:135m").capabilities


def test_bad_images_are_refused_and_the_server_goes_on(vision):
    server, name = vision
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="not a picture"):
        _ask(client, name, b"\x89PNG\r\n\x1a\n but not really an image" * 10)
    huge = io.BytesIO()
    Image.new("1", (9000, 6000)).save(huge, "PNG")  # 54 megapixels in a few kilobytes
    with pytest.raises(openai.BadRequestError, match="million"):
        _ask(client, name, huge.getvalue())
    with pytest.raises(openai.BadRequestError, match="not fetched"):
        client.chat.completions.create(model=name, max_tokens=2, messages=[{
            "role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "http://169.254.169.254/latest/meta-data"}}]}])
    with pytest.raises(openai.BadRequestError, match="takes no images"):
        _ask(client, "smollm2:135m", _png((1, 2, 3)))
    bad = httpx.post(server.url + "/api/chat", timeout=30, json={
        "model": name, "stream": False,
        "messages": [{"role": "user", "content": "hi", "images": ["not base64!"]}]})
    assert bad.status_code == 400 and "base64" in bad.json()["error"]
    assert _ask(client, name, _png((9, 9, 9))).choices  # still serving


def test_anthropic_client_sends_image_blocks(vision):
    import anthropic

    server, name = vision
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(_png((90, 90, 20))).decode()}}
    ask = {"type": "text", "text": "What is this?"}
    plain = client.messages.create(model=name, max_tokens=3,
                                   messages=[{"role": "user", "content": [ask]}])
    seen = client.messages.create(model=name, max_tokens=3,
                                  messages=[{"role": "user", "content": [block, ask]}])
    assert seen.usage.input_tokens >= plain.usage.input_tokens + IMAGE_TOKENS
    with client.messages.stream(model=name, max_tokens=3, messages=[
            {"role": "user", "content": [block, ask]},
            {"role": "assistant", "content": "A square."},
            {"role": "user", "content": [block, {"type": "text", "text": "Again?"}]}]) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens >= plain.usage.input_tokens + 2 * IMAGE_TOKENS
    with pytest.raises(anthropic.BadRequestError, match="not fetched"):
        client.messages.create(model=name, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/x.png"}}, ask]}])


def test_responses_input_image_is_kept_for_the_next_turn(vision):
    server, name = vision
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    picture = {"type": "input_image", "image_url": _data_url(_png((10, 120, 200)))}
    plain = client.responses.create(model=name, max_output_tokens=3, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}]}])
    first = client.responses.create(model=name, max_output_tokens=3, temperature=0, input=[
        {"role": "user", "content": [picture, {"type": "input_text", "text": "What is this?"}]}])
    assert first.usage.input_tokens >= plain.usage.input_tokens + IMAGE_TOKENS
    # the stored conversation keeps the picture: the next turn reads it from the cache
    second = client.responses.create(model=name, max_output_tokens=3, temperature=0,
                                     previous_response_id=first.id, input="And its colour?")
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= IMAGE_TOKENS
    with pytest.raises(openai.BadRequestError, match="input_image"):
        client.responses.create(model=name, max_output_tokens=3, input=[
            {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])


@pytest.fixture(scope="module")
def pictures_online():
    """A web server on loopback with a picture, a redirect to it, and a missing one."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    png = _png((240, 200, 20))

    class Pictures(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/yellow.png":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(png)))
                self.end_headers()
                self.wfile.write(png)
            elif self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/yellow.png")
                self.end_headers()
            elif self.path == "/round":  # a redirect to itself, for ever
                self.send_response(302)
                self.send_header("Location", "/round")
                self.end_headers()
            elif self.path == "/huge.png":  # more than a picture may be, sent without a length
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                try:
                    for _ in range(22):
                        self.wfile.write(bytes(1 << 20))
                except OSError:
                    pass  # (the server stopped reading: as it should)
            else:
                self.send_error(404)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _by_url(client: openai.OpenAI, name: str, url: str):
    return client.chat.completions.create(model=name, max_tokens=2, messages=[{
        "role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                    {"type": "text", "text": "What is it?"}]}])


def test_image_urls_are_fetched_only_as_the_setting_allows(vision, tmp_path, pictures_online):
    import anthropic

    _, name = vision
    home = vision[0].log.parent
    anywhere = start_server(home, "--model", name, "--image-urls", "any", ready_timeout=120)
    public = start_server(home, "--image-urls", "public")
    try:
        client = openai.OpenAI(base_url=anywhere.url + "/v1", api_key="unused", max_retries=0)
        plain = client.chat.completions.create(model=name, max_tokens=2, messages=[
            {"role": "user", "content": "What is it?"}])
        fetched = _by_url(client, name, pictures_online + "/yellow.png")
        assert fetched.usage.prompt_tokens >= plain.usage.prompt_tokens + IMAGE_TOKENS
        moved = _by_url(client, name, pictures_online + "/moved")  # the same picture: cached
        assert moved.usage.prompt_tokens_details.cached_tokens >= IMAGE_TOKENS
        with pytest.raises(openai.BadRequestError, match="answered 404"):
            _by_url(client, name, pictures_online + "/missing.png")
        with pytest.raises(openai.BadRequestError, match="redirected more than 3 times"):
            _by_url(client, name, pictures_online + "/round")
        with pytest.raises(openai.BadRequestError, match="over 20 MB"):
            _by_url(client, name, pictures_online + "/huge.png")
        claude = anthropic.Anthropic(base_url=anywhere.url, api_key="unused", max_retries=0)
        seen = claude.messages.create(model=name, max_tokens=2, messages=[{
            "role": "user", "content": [
                {"type": "image", "source": {"type": "url",
                                             "url": pictures_online + "/yellow.png"}},
                {"type": "text", "text": "What is it?"}]}])
        assert seen.usage.input_tokens >= IMAGE_TOKENS

        careful = openai.OpenAI(base_url=public.url + "/v1", api_key="unused", max_retries=0)
        for url in (pictures_online + "/yellow.png", "http://169.254.169.254/latest/meta-data",
                    "http://10.1.2.3/x.png"):
            with pytest.raises(openai.BadRequestError, match="not a public address"):
                _by_url(careful, name, url)
    finally:
        stop_server(anywhere)
        stop_server(public)
