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


_CODE = 'root ::= "x\\n  y\\nz w"'  # a second line indented by 2, a third by none
#: greedy under a grammar of letters, then the end-of-generation token (a bias of 100)
_EOS_AFTER_TEXT = {
    "prompt": "Hi",
    "n_predict": 5,
    "grammar": "root ::= [a-z]+",
    "logit_bias": [[2, 100]],
    "n_probs": 1,
    "temperature": 0,
}
#: llama-server requests whose answers depend on no numerics (a grammar forces the text,
#: or the answer is about the request itself): name -> (path, body). One slot of 256.
REQUESTS = {
    "n_indent": (
        "/completion",
        {"prompt": "def f():", "n_predict": 24, "grammar": _CODE, "n_indent": 2},
    ),
    "n_indent_off": ("/completion", {"prompt": "def f():", "n_predict": 24, "grammar": _CODE}),
    "stop_string": (
        "/completion",
        {"prompt": "Hi", "n_predict": 24, "grammar": 'root ::= "ab-cd"', "stop": "-"},
    ),
    "response_fields": (
        "/completion",
        {
            "prompt": "Hi",
            "n_predict": 3,
            "response_fields": [
                "content",
                "timings/prompt_n",
                "generation_settings/n_predict",
                "nope/x",
            ],
        },
    ),
    "samplers_letters": ("/completion", {"prompt": "Hi", "n_predict": 1, "samplers": "kyt"}),
    "samplers_other_names": (
        "/completion",
        {"prompt": "Hi", "n_predict": 1, "samplers": ["nucleus", "min-p", "temp", "bogus"]},
    ),
    "logit_bias_malformed": (
        "/completion",
        {"prompt": "Hi", "n_predict": 1, "logit_bias": [[29], [29, "x"], [5, False], [7, 1.5]]},
    ),
    "negative_values": (
        "/completion",
        {"prompt": "Hi", "n_predict": 2, "temperature": -1, "top_k": -5, "n_probs": -1},
    ),
    "tokens_cached": ("/completion", {"prompt": "The sea is", "n_predict": 4, "ignore_eos": True}),
    "cache_prompt_off": (
        "/completion",
        {"prompt": "The sea is " * 20, "n_predict": 1, "cache_prompt": False},
    ),
    "stream_partials": (
        "/completion",
        {"prompt": "Hi", "n_predict": 3, "stream": True, "timings_per_token": True},
    ),
    # the end-of-generation token: counted, listed and streamed (a bias of 100 picks it)
    "eos_first": (
        "/completion",
        {
            "prompt": "Hi",
            "n_predict": 4,
            "logit_bias": [[2, 100]],
            "n_probs": 1,
            "return_tokens": True,
            "temperature": 0,
        },
    ),
    "eos_after_text": ("/completion", {**_EOS_AFTER_TEXT, "return_tokens": True}),
    "eos_after_text_stream": ("/completion", {**_EOS_AFTER_TEXT, "stream": True}),
    "empty_prompt": ("/completion", {"prompt": "", "n_predict": 2}),
    "empty_prompt_v1": ("/v1/completions", {"prompt": "", "max_tokens": 2}),
    "id_slot_past_the_last": ("/completion", {"prompt": "Hi", "n_predict": 1, "id_slot": 5}),
    "v1_stream_usage": ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True}),
    "chat_n_probs": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n_probs": 2},
    ),
    "overflow": ("/completion", {"prompt": "a " * 300, "n_predict": 1}),
    "overflow_chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a " * 300}], "max_tokens": 1},
    ),
}
