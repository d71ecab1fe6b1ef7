"""What the chat app costs the engine: decode tok/s of a reply streamed into the Textual app
(headless, the same drawing work as on screen) against the same engine with nobody drawing.

On a small CPU the app's Python work (Markdown, status bar) competes with the engine for cores
and the GIL, so this is the figure to watch when the app changes. Same model, prompt, greedy,
threads; runs alternate so machine noise hits both alike.

    python3 bench/chat_app_overhead.py [--tokens 200] [--reps 3] [--results FOLDER]

Writes bench/results/chat_app_overhead.{json,png,md}.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

import harness
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.settings import Settings
from localinfer.tui.chat_app import ChatApp
from localinfer.tui.client import LocalClient
from localinfer.tui.conversations import ConversationStore

MODELS = ("smollm2:135m", "gemma3:270m")
PROMPT = "Write a short story about a lighthouse keeper."


async def _in_app(app: ChatApp, n_tokens: int) -> float:
    await app.action_new_chat()
    app.pending_settings = {"system": "", "params": {"temperature": 0, "max_tokens": n_tokens}}
    app.prompt.post_message(app.prompt.Submitted(PROMPT))
    while not app.replying:
        await asyncio.sleep(0.01)
    while app.replying:
        await asyncio.sleep(0.02)
    return app.history[-1].figures["decode_tps"]


def _bare(client: LocalClient, n_tokens: int) -> float:
    generation = client.backend.chat([{"role": "user", "content": PROMPT}],
                                     SamplingParams(temperature=0, max_tokens=n_tokens))
    generation.text()
    return generation.stats.decode_tps


async def bench_model(name: str, n_tokens: int, reps: int, home: Path) -> dict:
    client = LocalClient(Settings(home=home), LoadOptions(n_ctx=2048))
    app = ChatApp(client, ConversationStore(home / f"{name.replace(':', '-')}.db"), name)
    app_tps, bare_tps = [], []
    async with app.run_test(size=(80, 24)):
        while not app.model_ready.is_set():
            await asyncio.sleep(0.05)
        for _ in range(reps):
            app_tps.append(await _in_app(app, n_tokens))
            bare_tps.append(await asyncio.to_thread(_bare, client, n_tokens))
    result = {"model": name, "app_decode_tps": app_tps, "bare_decode_tps": bare_tps,
              "ratio": statistics.median(app_tps) / statistics.median(bare_tps)}
    print(f"{name}: in the app {statistics.median(app_tps):.1f} tok/s, bare "
          f"{statistics.median(bare_tps):.1f} tok/s, ratio {result['ratio']:.2f}")
    return result


def main() -> None:
    parser = harness.arguments(__doc__, tokens=200, reps=3)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="localinfer-bench-"))
    results = [asyncio.run(bench_model(name, args.tokens, args.reps, home)) for name in MODELS]
    meta = harness.run_facts(models=list(MODELS), tokens=args.tokens, reps=args.reps)
    lines = ["# Chat app overhead", "",
             f"Greedy, {args.tokens} tokens, median of {args.reps} alternating runs.", "",
             "| model | in the app (tok/s) | engine alone (tok/s) | ratio |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {statistics.median(r['app_decode_tps']):.1f} | "
                     f"{statistics.median(r['bare_decode_tps']):.1f} | {r['ratio']:.2f} |")
    fig, axes = harness.figure(1, 1, size=(6, 3.5))
    ax = axes[0][0]
    names = [r["model"] for r in results]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [statistics.median(r["bare_decode_tps"]) for r in results],
           0.4, label="engine alone")
    ax.bar([i + 0.2 for i in x], [statistics.median(r["app_decode_tps"]) for r in results],
           0.4, label="streamed into the chat app")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("decode tok/s")
    ax.set_title("What drawing the reply costs the engine")
    ax.legend()
    harness.write("chat_app_overhead", meta, results, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
