"""SVG snapshots of the main screens at 80×24 and 120×40 (update: pytest --snapshot-update).

The machine-dependent figures are pinned so a snapshot shows layout, not this machine: a
CPU-only machine with 16 GiB free for the fit badges, 300 MiB of process memory, and saved
timestamps. The model is the real smollm2, loaded in-process.
"""

from __future__ import annotations


import pytest

from localinfer.backends.base import LoadOptions
from localinfer.backends.metrics import Figures
from localinfer.model_store.hardware import CPU, Hardware
from localinfer.settings import Settings
from localinfer.tui.chat_app import ChatApp
from localinfer.tui.client import LocalClient
from localinfer.tui.conversations import ConversationStore, StoredMessage

GIB = 2**30
MACHINE = Hardware(cpu=CPU("Example CPU", 8, 16, ("avx", "avx2", "fma", "f16c")),
                   ram_total_bytes=32 * GIB, ram_available_bytes=16 * GIB, gpus=(),
                   gpu_offload=False, compute_backends=("CPU",))
REPLY = """Here is a tiny Python function:

```python
def greet(name: str) -> str:
    return f"Hello, {name}!"
```

It returns a **greeting**."""
FIGURES = Figures(prompt_tokens=41, cached_tokens=0, generated_tokens=38, ttft_s=0.084,
                  tpot_s=0.011, e2el_s=0.49, prefill_tps=520.0, decode_tps=91.3,
                  queue_time_s=0.0, finish_reason="stop")


def _app(home) -> ChatApp:
    store = ConversationStore(home / "chats.db")
    chat = store.create("smollm2:135m", "Python greeting", params={"temperature": 0})
    store.add(chat.id, StoredMessage("user", "Write a Python function that greets someone."))
    store.add(chat.id, StoredMessage("assistant", REPLY, FIGURES))
    other = store.create("smollm2:135m", "Capital of France")
    store.add(other.id, StoredMessage("user", "What is the capital of France?"))
    with store.db:
        store.db.execute("UPDATE conversations SET updated_at = '2026-11-20T09:30:00+00:00' "
                         "WHERE id = ?", (chat.id,))
        store.db.execute("UPDATE conversations SET updated_at = '2026-11-19T18:05:00+00:00' "
                         "WHERE id = ?", (other.id,))
    client = LocalClient(Settings(), LoadOptions(n_ctx=1024), hardware=lambda: MACHINE,
                         process_memory=lambda: 300 * 2**20)
    return ChatApp(client, store, "smollm2:135m", status_interval=3600)


async def _opened(pilot) -> None:
    app = pilot.app
    app.prompt.cursor_blink = False  # a blinking cursor would make the snapshot a coin toss
    while not app.model_ready.is_set():
        await pilot.pause(0.05)
    await app.open_conversation(1)
    await app.refresh_status()
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_chat_screen(snap_compare, _private_home, size):
    assert snap_compare(_app(_private_home), terminal_size=size, run_before=_opened)


def test_model_picker(snap_compare, _private_home):
    async def picker(pilot) -> None:
        await _opened(pilot)
        await pilot.press("ctrl+t")
        while not getattr(pilot.app.screen, "rows", None):
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        await _header_drawn_over_its_rows(pilot)

    assert snap_compare(_app(_private_home), terminal_size=(80, 24), run_before=picker)


async def _header_drawn_over_its_rows(pilot, tries: int = 40) -> None:
    """Now and then the table's header is drawn at the widths it had before its rows came
    (compact labels over wide columns) and the snapshot caught that frame: wait until the
    header's 'fit' stands over the rows' fit column, redrawing meanwhile."""
    from textual.widgets import DataTable

    table = pilot.app.screen.query_one(DataTable)
    for _ in range(tries):
        header, first = (table.render_line(y).text for y in (0, 1))
        if "fit" in header and header.index("fit") == first.index("CPU"):
            break
        await pilot.pause(0.05)
    # the table now draws right, but the screen may still hold the stale frame: redraw it
    table.refresh()
    pilot.app.screen.refresh()
    await pilot.pause(0.2)


def test_pictures(snap_compare, _private_home, tmp_path):
    """A message sent with two pictures, one of them kept damaged, and two more attached to
    the next message, the second focused (the footer offers to remove it)."""
    from PIL import Image

    from localinfer.tui.pictures import Picture, attach

    for name, size in {"cat.jpg": (640, 480), "chart.png": (1600, 900),
                       "scan.png": (300, 420)}.items():
        Image.new("RGB", size, (90, 120, 200)).save(tmp_path / name)
    app = _app(_private_home)
    lost = Picture("photo.png", 800, 600, b"\x89PNG\r\n\x1a\n damaged")
    app.store.add(1, StoredMessage("user", "Which of these is a chart?",
                                   pictures=[attach(tmp_path / "chart.png"), lost]))

    async def attached(pilot) -> None:
        await _opened(pilot)
        await app.attached.set_pictures([attach(tmp_path / "cat.jpg"),
                                         attach(tmp_path / "scan.png")])
        app.attached.query("PictureChip").last().focus()
        app.clear_notifications()  # (the damaged one's notice: tests/tui/test_pictures.py)
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=attached)


@pytest.mark.parametrize("key", ["ctrl+o", "ctrl+s"], ids=["conversations", "settings"])
def test_dialog(snap_compare, _private_home, key):
    async def dialog(pilot) -> None:
        await _opened(pilot)
        await pilot.press(key)
        for widget in pilot.app.screen.query("*"):  # the dialog's own fields blink too
            if hasattr(widget, "cursor_blink"):
                widget.cursor_blink = False
        await pilot.pause(0.2)

    assert snap_compare(_app(_private_home), terminal_size=(80, 24), run_before=dialog)
