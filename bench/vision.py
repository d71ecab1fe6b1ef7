"""What an image costs the streams beside it: a chat stream's inter-token latency while other
requests ask about pictures, with each image encoded on the projector's own thread (now)
and with the engine waiting for each encode between steps (before).

    python3 bench/vision.py [--layers 6] [--reps 2] [--images 2] [--results FOLDER]

Gemma 3 270M (the embedded model) with a random-weight projector of Gemma 3's own vision
tower (bench/random_mmproj.py --gemma3: SigLIP's widths, 896 px, 256 tokens an image), of
`--layers` of its 27 blocks: the encode's time grows with the blocks, and a whole tower takes
about 4.5x the default's here. In one process with the engine a runner runs (the same
thread, steps and projector), so both ways can be switched in one run (Engine.overlap_images).
First the stream alone before any picture; then each round: the stream alone; then the
stream while `--images` requests in a row each ask about a new 640×480 picture — both ways,
their order alternating by round. Reported: the
stream's gaps (p50, p99, the longest), its tokens a second while the pictures are read, and
each picture request's time to its first token (its encode, the decode of its 256
embeddings and its text).

Writes bench/results/vision.{json,md,png}.
"""

from __future__ import annotations

import logging
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness
import numpy

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.base import Image
from localinfer.model_store.sources import resolve

WAYS = {True: "encoded beside the streams (now)", False: "waited for between steps (before)"}
QUESTION = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "What is in this picture?"}]}]


def projector_file(text_model: Path, layers: int) -> Path:
    out = harness.STORE / f"mmproj-gemma3-896-{layers}-blocks--{text_model.stem}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        subprocess.run([sys.executable, str(harness.ROOT / "bench" / "random_mmproj.py"),
                        str(partial), "--text-model", str(text_model), "--gemma3", "--layers",
                        str(layers), "--image-size", "896", "--tokens", "256"], check=True)
        partial.replace(out)
    return out


def picture(seed: int) -> Image:
    rng = numpy.random.default_rng(seed)
    return Image(rng.integers(0, 256, 640 * 480 * 3, dtype=numpy.uint8).tobytes(), 640, 480)


def stream_beside(backend: LlamaCppBackend, images: list[Image] | None, seconds: float
                  ) -> dict:
    """A greedy stream's token times, while `images` are asked about one after another
    (or, with None, alone for `seconds`); each picture request's time to its first token."""
    stream = backend.generate(backend.tokenize("Tell me a long story about a lighthouse."),
                              SamplingParams(temperature=0, max_tokens=100_000,
                                             ignore_eos=True))
    times: list[float] = []
    reader = threading.Thread(target=lambda: times.extend(
        time.perf_counter() for e in stream if isinstance(e, TokenEvent)))
    reader.start()
    while len(times) < 10:
        time.sleep(0.01)
    began = time.perf_counter()
    first_tokens = []
    if images is None:
        time.sleep(seconds)
    for image in images or ():
        asked = time.perf_counter()
        _, generation = backend.start(SamplingParams(temperature=0, max_tokens=4), QUESTION,
                                      images=[image])
        for event in generation:
            if isinstance(event, TokenEvent):
                first_tokens.append(time.perf_counter() - asked)
                generation.cancel()
                for _ in generation:
                    pass
                break
    ended = time.perf_counter()
    stream.cancel()
    reader.join()
    window = [t for t in times if began <= t <= ended]
    gaps = [b - a for a, b in zip(window, window[1:])]
    return {"gaps": gaps, "tokens_per_s": (len(window) - 1) / (ended - began),
            "seconds": ended - began, "first_token_s": first_tokens}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = harness.arguments(__doc__, reps=2)
    parser.add_argument("--layers", type=int, default=6,
                        help="blocks of Gemma 3's 27 in the projector's tower [6]")
    parser.add_argument("--images", type=int, default=2, help="picture requests a round [2]")
    args = parser.parse_args()
    logging.getLogger("localinfer.llama_cpp").setLevel(logging.ERROR)  # llama.cpp's chatter
    text_model = resolve("gemma3:270m", harness.STORE).path
    mmproj = projector_file(text_model, args.layers)
    backend = LlamaCppBackend(text_model, LoadOptions(n_ctx=4096, n_slots=2,
                                                      projector=str(mmproj)))
    rows = []
    try:
        # the stream before any picture: after one, a kept encoder thread's OpenMP team
        # made every later step slower (the encoder's thread now ends with its image)
        first = stream_beside(backend, None, 8.0)
        rows.append({"rep": -1, "case": "alone, before any picture", **first})
        stream_beside(backend, [picture(99_999)], 0)  # warm: the first encode allocates
        for rep in range(args.reps):
            ways = [True, False] if rep % 2 == 0 else [False, True]
            images_s = []
            for overlap in ways:
                backend.engine.overlap_images = overlap
                result = stream_beside(backend, [picture(rep * 100 + i + 50 * overlap)
                                                 for i in range(args.images)], 0)
                rows.append({"rep": rep, "case": WAYS[overlap], **result})
                images_s.append(result["seconds"])
                print(rep, WAYS[overlap], f"p99 {pct(result['gaps'], 0.99) * 1e3:.0f} ms, "
                      f"longest {max(result['gaps']) * 1e3:.0f} ms, first tokens "
                      f"{[round(s, 2) for s in result['first_token_s']]} s", flush=True)
            alone = stream_beside(backend, None, statistics.mean(images_s))
            rows.append({"rep": rep, "case": "alone", **alone})
            print(rep, "alone", f"p99 {pct(alone['gaps'], 0.99) * 1e3:.0f} ms", flush=True)
    finally:
        backend.engine.overlap_images = True
        backend.close()

    cases = ["alone, before any picture", "alone", *WAYS.values()]
    summary = {}
    for case in cases:
        gaps = [g for r in rows if r["case"] == case for g in r["gaps"]]
        firsts = [s for r in rows if r["case"] == case for s in r["first_token_s"]]
        summary[case] = {
            "p50_ms": pct(gaps, 0.5) * 1e3, "p99_ms": pct(gaps, 0.99) * 1e3,
            "longest_ms": max(gaps) * 1e3,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows
                                              if r["case"] == case),
            "image_first_token_s": statistics.median(firsts) if firsts else None}
    now, before = summary[WAYS[True]], summary[WAYS[False]]
    lines = ["# What an image costs the streams beside it", "",
             f"Gemma 3 270M with a random projector of Gemma 3's vision tower ({args.layers} "
             f"of its 27 blocks, 896 px, 256 tokens an image), 2 slots; {args.reps} rounds, "
             f"{args.images} picture requests in a row beside one greedy stream.", ""]
    lines += harness.markdown_table(
        ["the stream", "gap p50", "gap p99", "longest gap", "stream tok/s",
         "a picture's first token"],
        [[case, f"{f['p50_ms']:.0f} ms", f"{f['p99_ms']:.0f} ms", f"{f['longest_ms']:.0f} ms",
          f"{f['tokens_per_s']:.1f}", "—" if f["image_first_token_s"] is None
          else f"{f['image_first_token_s']:.2f} s"] for case, f in summary.items()])
    lines += ["", f"Encoded beside the streams, the longest gap is "
              f"{before['longest_ms'] / now['longest_ms']:.0f}× shorter than when the engine "
              f"waited for each encode; a picture's first token comes "
              f"{now['image_first_token_s'] / before['image_first_token_s']:.2f}× as late "
              f"(the encoder and the decode share the CPU)."]
    fig, axes = harness.figure(2, 1, size=(5.5, 4))
    left, right = axes[0]
    for case, colour in zip(cases, ["tab:blue", "tab:green", "tab:red"]):
        gaps = sorted(g * 1e3 for r in rows if r["case"] == case for g in r["gaps"])
        left.plot(gaps, [i / len(gaps) for i in range(len(gaps))], color=colour,
                  label="alone" if case == "alone" else f"beside pictures, {case}")
    left.set_xscale("log")
    left.set_xlabel("stream's inter-token latency (ms)")
    left.set_ylabel("fraction of gaps")
    left.legend(fontsize=7)
    right.bar([0, 1], [now["longest_ms"] / 1e3, before["longest_ms"] / 1e3],
              color=["tab:green", "tab:red"])
    right.bar([3, 4], [now["image_first_token_s"], before["image_first_token_s"]],
              color=["tab:green", "tab:red"])
    right.set_xticks([0, 1, 3, 4], ["now", "before", "now", "before"], fontsize=8)
    right.set_ylabel("seconds")
    right.set_title("the stream's longest gap | a picture's first token", fontsize=9)
    meta = harness.run_facts(model="gemma3:270m", layers=args.layers, reps=args.reps,
                             images=args.images)
    harness.write("vision", meta, {"summary": summary, "rounds": rows}, lines, fig,
                  args.results)


if __name__ == "__main__":
    main()
