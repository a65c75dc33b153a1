"""The decide engine: System One answers read from a chat GGUF's next-token distribution.

`backend.py` is the port, `policy.py` the rules over token ids and a logit row (no llama.cpp),
`prompts.py` how System One questions become prompts, `llama.py` the one llama.cpp adapter.
"""
