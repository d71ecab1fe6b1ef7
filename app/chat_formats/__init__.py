"""How a model family writes its chat: tool calls and reasoning read out of its replies,
grammars in its call syntax, its template rendered — below the backends, for the front ends
and the engine alike. A newcomer's walk:

- `detect.py`: `ChatFormat` and `detect`, which names a template's syntax from its text
- `families/`: one module per call syntax, its section parser and its forced call's grammar
- `scan.py`: what the families share (reading JSON as a section grows, held marks, frames)
- `parser.py`: `ReplyParser`, the streaming state machine (content, reasoning, calls)
- `reply.py`: what it gives out, `Piece`s, and a whole `Reply`
- `calls.py`: a forced call's grammar, and the lazy grammar of an auto call
- `prompt.py`: thinking on or off, a reasoning budget in the family's marks, `start_chat`
- `tokenizer.py`: the protocols a model meets for these (`Tokenizer`, `ChatModel`)
- `template.py`: chat templates, rendered in a sandbox; `grammar.py`: JSON schema → GBNF;
  `think.py`: `ThinkLimit`, which the Backend interface carries

It exports nothing itself: the Backend interface imports `think.py` through this package,
which must stay light (no parser, no llama.cpp grammar converter); import each name from its
module.
"""
