"""A fill-in-the-middle variant of the tiny llama fixture (its GGUF names FIM tokens, as
a code model's does) and the requests whose llama-server answers
tests/fixtures/llamaserver/goldens.json records."""

from __future__ import annotations

from pathlib import Path

from llamay.gguf.writer import copy_gguf

#: SmolLM2's vocabulary has StarCoder's <repo_name> and <file_sep>; the three FIM slots
#: borrow <issue_start>, <issue_comment>, <issue_closed> (control tokens of its own).
FIM_META = {
    "tokenizer.ggml.fim_pre_token_id": 8,
    "tokenizer.ggml.fim_suf_token_id": 9,
    "tokenizer.ggml.fim_mid_token_id": 10,
    "tokenizer.ggml.fim_rep_token_id": 3,
    "tokenizer.ggml.fim_sep_token_id": 5,
}

INFILL_REQUEST = {
    "input_prefix": "def add(a, b):\n    ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"filename": "util.py", "text": "ONE = 1\n"}, {"text": "TWO = 2\n"}],
    "prompt": "return",
    "n_predict": 2,
    "temperature": 0,
}

POST_PROB_REQUESTS = [
    {"prompt": "The sea is", "n_predict": 1, "n_probs": 10, "post_sampling_probs": True},
    {
        "prompt": "The sea is",
        "n_predict": 1,
        "n_probs": 10,
        "post_sampling_probs": True,
        "top_k": 5,
        "top_p": 1.0,
        "min_p": 0.0,
        "temperature": 1.7,
    },
    {
        "prompt": "Once upon a time",
        "n_predict": 1,
        "n_probs": 8,
        "post_sampling_probs": True,
        "top_k": 0,
        "top_p": 0.5,
        "min_p": 0.0,
        "temperature": 0.6,
    },
    {"prompt": "The sea is", "n_predict": 1, "n_probs": 4, "post_sampling_probs": True,
     "temperature": 0},
]  # fmt: skip


def write_fim_model(src: Path, dst: Path) -> Path:
    from llamay.gguf.constants import GGUFValueType

    types = dict.fromkeys(FIM_META, GGUFValueType.UINT32)
    return copy_gguf(src, dst, metadata=FIM_META, types=types, fsync=False)
