"""Characters to tokens and back, for the example streaming models: a step's Python
functions, called once per batch (and by the stock model, once per request).

Token 0 ends a text; 1..95 are the printable ASCII characters.
"""

import numpy as np

MAX_PROMPT = 192  # characters: the transformer's context holds the prompt and what follows
_UNKNOWN = ord("?") - 31


def encode(text: bytes) -> np.ndarray:
    """One prompt's token ids; a ValueError says what is wrong with it."""
    if isinstance(text, str):
        text = text.encode()
    if not text:
        raise ValueError("the prompt is empty")
    if len(text) > MAX_PROMPT:
        raise ValueError(f"the prompt has {len(text)} characters; at most {MAX_PROMPT} are read")
    codes = np.frombuffer(text, dtype=np.uint8).astype(np.int64) - 31
    codes[(codes < 1) | (codes > 95)] = _UNKNOWN
    return codes


def tokenize(text):
    """text [B, 1] bytes -> ids [B, T] padded with 0, lengths [B, 1]."""
    prompts = [encode(row[0]) for row in text]
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in zip(ids, prompts):
        row[:len(prompt)] = prompt
    return ids, np.array([[len(p)] for p in prompts], dtype=np.int64)


def decode(token) -> bytes:
    return b"" if token == 0 else bytes([int(token) + 31])


def detokenize(token):
    """token [B, 1] -> text_output [B, 1]: each stream's new character (nothing for the end)."""
    out = np.empty((len(token), 1), dtype=object)
    for i, value in enumerate(token[:, 0]):
        out[i, 0] = decode(value)
    return out
