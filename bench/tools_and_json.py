"""Tools and structured output as an editor's client sees them: the first streamed text of a
request with tools against the TTFT the server reports, and JSON-constrained decoding
against unconstrained on the same prompt.

    python3 bench/tools_and_json.py [--reps 5] [--tokens 96] [--results FOLDER]

1. Through `localinfer serve` and the unmodified `openai` client, streaming, smollm2: a
   request with `tools` (tool_choice auto) and the same request without. The client's
   clock runs from the call to its first content delta; the server's TTFT is the one it
   reports in the reply's `timings`. Each request begins with a text of its own, so none is
   served from another's cached prompt. Their ratio is what the honest numbers are worth here
   (before this release a request with tools was held back to its end: 2.7-15.7 s against
   a reported 124-696 ms).
2. In one engine, the same prompt at temperature 0.7: unconstrained; `json_object` (any
   JSON) and a small `json_schema`, each sampled as now (draw first, the grammar asked of
   the drawn token, the whole vocabulary only when it refuses) and as before (llama.cpp's
   plain chain: the grammar over every token first). Decode tok/s from the engine's own
   timings, the variants alternating within each round.

Writes bench/results/tools_and_json.{json,md,png}.
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time

import harness
import openai
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.chat_formats.grammar import ANY_JSON, json_schema_grammar
from localinfer.backends.native.model import SamplerChain
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.model_store.sources import resolve

MODEL = "smollm2:135m"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}


def first_text(client: openai.OpenAI, tools: bool, tokens: int, seed: int) -> dict:
    extra = {"tools": [WEATHER]} if tools else {}
    started = time.perf_counter()
    first = None
    timings = {}
    for chunk in client.chat.completions.create(
            model=MODEL, stream=True, temperature=0.7, seed=seed, max_tokens=tokens,
            # a text of its own first: no request finds another's prompt in the cache
            messages=[{"role": "system", "content": f"Request {seed}-{tools}. Be kind."},
                      {"role": "user", "content": "Tell me a short story about a lighthouse."}],
            **extra):
        if first is None and chunk.choices and (chunk.choices[0].delta.content or "").strip():
            first = time.perf_counter() - started
        timings = (chunk.model_extra or {}).get("timings") or timings
    return {"tools": tools, "client_first_text_s": first, "server_ttft_s": timings["ttft_ms"] / 1e3}


def decode_tps(backend: LlamaCppBackend, grammar: str | None, before: bool, tokens: int,
               seed: int) -> dict:
    SamplerChain.shortcuts = not before
    prompt = backend.tokenize("Write a JSON object describing a person:")
    bias = {} if grammar else {backend.native.eos(): -100}
    generation = backend.generate(prompt, SamplingParams(temperature=0.7, seed=seed,
                                                         max_tokens=tokens, grammar=grammar,
                                                         logit_bias=bias))
    generation.text()
    SamplerChain.shortcuts = True
    stats = generation.stats
    return {"decode_tps": stats.decode_tps, "tokens": stats.generated_tokens}


def main() -> None:
    args = harness.arguments(__doc__, reps=5, tokens=96).parse_args()
    logging.disable(logging.WARNING)
    ttft_rows = []
    with tempfile.TemporaryDirectory() as home:
        server = harness.start_serve([sys.executable, "-m", "localinfer", "serve"], MODEL, 1,
                                     1024, home)
        try:
            client = openai.OpenAI(base_url=server[1] + "/v1", api_key="unused")
            for rep in range(args.reps):
                for tools in ((True, False) if rep % 2 else (False, True)):
                    row = {"rep": rep, **first_text(client, tools, args.tokens, rep)}
                    ttft_rows.append(row)
                    print(row, flush=True)
        finally:
            harness.stop_servers({"localinfer": server})
    backend = LlamaCppBackend(resolve(MODEL, harness.STORE).path,
                              LoadOptions(n_ctx=1024, n_slots=1), name=MODEL)
    variants = {"unconstrained": (None, False),
                "json_object, grammar first (before)": (ANY_JSON, True),
                "json_object, draw then check (now)": (ANY_JSON, False),
                "json_schema, grammar first (before)": (json_schema_grammar(PERSON), True),
                "json_schema, draw then check (now)": (json_schema_grammar(PERSON), False)}
    decode_rows = []
    try:
        for rep in range(args.reps):
            order = list(variants) if rep % 2 == 0 else list(reversed(variants))
            for name in order:
                grammar, before = variants[name]
                row = {"rep": rep, "variant": name,
                       **decode_tps(backend, grammar, before, args.tokens, rep)}
                decode_rows.append(row)
                print(row, flush=True)
    finally:
        backend.close()

    def median(rows, key, **match):
        values = [r[key] for r in rows if all(r[k] == v for k, v in match.items())
                  and r[key] is not None]
        return statistics.median(values) if values else None

    def ratio_per_round(name):  # variant / unconstrained, within each round
        ratios = []
        for rep in range(args.reps):
            base = median(decode_rows, "decode_tps", rep=rep, variant="unconstrained")
            value = median(decode_rows, "decode_tps", rep=rep, variant=name)
            if base and value:
                ratios.append(value / base)
        return statistics.median(ratios)

    def first_ratio(tools):
        return statistics.median(r["client_first_text_s"] / r["server_ttft_s"]
                                 for r in ttft_rows if r["tools"] == tools
                                 and r["client_first_text_s"])

    summary = {
        "first_text_over_ttft": {"with tools": first_ratio(True), "without": first_ratio(False)},
        "client_first_text_s": {t: median(ttft_rows, "client_first_text_s", tools=t)
                                for t in (True, False)},
        "server_ttft_s": {t: median(ttft_rows, "server_ttft_s", tools=t) for t in (True, False)},
        "decode_tps": {name: median(decode_rows, "decode_tps", variant=name) for name in variants},
        "decode_ratio": {name: ratio_per_round(name) for name in variants if name != "unconstrained"},
    }
    lines = ["# Tools and structured output", "",
             f"{MODEL}, {args.reps} rounds, up to {args.tokens} tokens a reply, temperature 0.7.",
             "", "## First streamed text against the server's TTFT (openai client, streaming)", ""]
    lines += harness.markdown_table(
        ["request", "client: first text (median)", "server: TTFT (median)",
         "client / server (median of ratios)"],
        [[("with tools" if t else "without tools"),
          f"{summary['client_first_text_s'][t] * 1e3:.0f} ms",
          f"{summary['server_ttft_s'][t] * 1e3:.0f} ms",
          f"{summary['first_text_over_ttft']['with tools' if t else 'without']:.3f}"]
         for t in (True, False)])
    lines += ["", "## JSON-constrained decoding against unconstrained (one engine)", ""]
    lines += harness.markdown_table(
        ["variant", "decode tok/s (median)", "of unconstrained (median of per-round ratios)"],
        [[name, f"{summary['decode_tps'][name]:.0f}",
          "1.00" if name == "unconstrained" else f"{summary['decode_ratio'][name]:.2f}"]
         for name in variants])
    fig, axes = harness.figure(2, 1, size=(5.5, 4))
    left, right = axes[0]
    left.bar(["with tools", "without"],
             [summary["first_text_over_ttft"]["with tools"],
              summary["first_text_over_ttft"]["without"]], color=["tab:orange", "tab:blue"])
    left.axhline(1.05, color="grey", linestyle="--", linewidth=1)
    left.set_ylabel("client's first text / server's TTFT")
    left.set_title("first streamed text (openai client)")
    names = [n for n in variants if n != "unconstrained"]
    right.barh(names, [summary["decode_ratio"][n] for n in names],
               color=["tab:grey" if "before" in n else "tab:green" for n in names])
    right.axvline(0.8, color="grey", linestyle="--", linewidth=1)
    right.set_xlabel("decode tok/s, of unconstrained")
    right.set_title("JSON-constrained decoding")
    meta = harness.run_facts(model=MODEL, reps=args.reps, tokens=args.tokens)
    harness.write("tools_and_json", meta, {"summary": summary, "first_text": ttft_rows,
                                           "decode": decode_rows}, lines, fig, args.results)


if __name__ == "__main__":
    main()
