"""One module per call syntax, each with its section parser (the calls read out of a
reply's text as it grows) and its forced call's grammar; `detect.py` names which a template
speaks and builds its `ChatFormat` from these.

- `hermes.py`: `<tool_call>{JSON}</tool_call>` (Hermes, Qwen 2.5/3, Granite 4)
- `listed.py`: a JSON list after a marker (Mistral Nemo, Granite 3, Command R7B)
- `mistral.py`: `[TOOL_CALLS]NAME[ARGS]{…}` (Mistral Small 3.2, Devstral, Ministral 3)
- `delimited.py`: calls between section tokens (DeepSeek V3.1 and R1, Kimi K2)
- `xml.py`: parameters as XML tags (Qwen3-Coder and its kin, GLM)
- `gemma4.py`: `<|tool_call>call:NAME{…}<tool_call|>` (Gemma 4)
- `harmony.py`: gpt-oss's channel messages
- `llama3.py`: a bare JSON call, or after `<|python_tag|>` (Llama 3.1–3.3)
- `generic.py`: the JSON shape a template without tools is taught
"""
