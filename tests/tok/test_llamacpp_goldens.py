"""Tokenisation and detokenisation of the two reference models against llama.cpp's goldens
(`tests/fixtures/llamacpp/`: 101 texts x 3 modes, and the greedy continuations)."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.model

MODES = {  # golden key -> (add_special, parse_special)
    "ids_add_special": (True, False),
    "ids_raw": (False, False),
    "ids_parse_special": (False, True),
}


@pytest.fixture(params=["smollm2", "gemma3", "smollm2_subset", "gemma3_subset"])
def model(request):
    """(golden name, tokenizer); *_subset encode on per-text engines only."""
    return request.param.removesuffix("_subset"), request.getfixturevalue(f"{request.param}_tok")


def tokenize_mismatches(tok, cases: list[dict], mode: str) -> list[tuple]:
    """The golden texts whose ids in `mode` differ from llama.cpp's: (text, ours, theirs)."""
    add_special, parse_special = MODES[mode]
    bad = []
    for case in cases:
        ids = tok.encode(case["text"], add_special=add_special, parse_special=parse_special)
        if ids != case[mode]:
            bad.append((case["text"][:60], ids[:12], case[mode][:12]))
    return bad


@pytest.mark.parametrize("mode", list(MODES))
def test_tokenize_matches_llamacpp(model, mode, llamacpp_goldens):
    name, tok = model
    cases = llamacpp_goldens[name]["tokenize"]
    assert len(cases) == 101
    bad = tokenize_mismatches(tok, cases, mode)
    assert not bad, f"{len(bad)} of {len(cases)} texts differ from llama.cpp: {bad[:5]}"


def test_a_corrupted_golden_is_caught(smollm2_tok, llamacpp_goldens):
    """The test of the test: one id changed in a copy of the goldens, and the comparison
    above reports exactly that text."""
    cases = copy.deepcopy(llamacpp_goldens["smollm2"]["tokenize"])
    victim = next(c for c in cases if len(c["ids_raw"]) > 3)
    victim["ids_raw"][2] += 1
    bad = tokenize_mismatches(smollm2_tok, cases, "ids_raw")
    assert [b[0] for b in bad] == [victim["text"][:60]]


def test_greedy_prompts_and_text(model, llamacpp_goldens):
    name, tok = model
    for g in llamacpp_goldens[name]["greedy"]:
        assert tok.encode(g["prompt"], add_special=True, parse_special=True) == g["prompt_ids"]
        assert tok.decode(g["greedy_ids"], skip_special=True) == g["text"]


def test_streaming_equals_decode(model, llamacpp_goldens):
    name, tok = model
    for g in llamacpp_goldens[name]["greedy"]:
        ids = g["prompt_ids"] + g["greedy_ids"]
        dec = tok.incremental_decoder(skip_special=True)
        pieces = [dec.feed(i) for i in ids] + [dec.flush()]
        assert "".join(pieces) == tok.decode(ids, skip_special=True)


def test_decode_roundtrip_on_corpus(model, llamacpp_goldens):
    name, tok = model
    for case in llamacpp_goldens[name]["tokenize"]:
        assert tok.decode(case["ids_raw"]) == case["text"]


def test_smollm2_vocab_facts(smollm2_tok):
    tok = smollm2_tok
    assert (tok.model, tok.pre, tok.vocab_size) == ("gpt2", "smollm", 49152)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (1, 2, False, False)
    # <|endoftext|>, <|im_end|> (EOS, EOT by text) and <reponame> (FIM repo, by text)
    assert tok.eot_ids == {0, 2, 4}
    assert tok.chat_template_source == "gguf"
    assert tok.token_to_piece(1) == b"<|im_start|>"
    assert tok.token_to_piece(1, special=False) == b""


def test_gemma3_vocab_facts(gemma3_tok):
    tok = gemma3_tok
    assert (tok.model, tok.vocab_size) == ("llama", 262144)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (2, 1, True, False)
    # <eos>, <end_of_turn> and </s> (llama.cpp's EOG text list)
    assert tok.eot_ids == {1, 106, 212}
    assert tok.chat_template_source == "builtin:gemma"
    assert tok.encode("") == [2]
    assert tok.decode([2, 9259], skip_special=True) == "Hello"


def test_chat_prompt_smollm2(smollm2_tok):
    tok = smollm2_tok
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special=True, parse_special=True)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> and two <|im_end|>


def test_chat_prompt_gemma3(gemma3_tok):
    tok = gemma3_tok
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
        "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tok.encode(text, add_special=True, parse_special=True)
    assert ids[:3] == [2, 105, 2364]  # <bos> <start_of_turn> user


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_subset_engines_never_build_the_full_one(name, request, llamacpp_goldens):
    tok = request.getfixturevalue(f"{name}_subset_tok")
    for case in llamacpp_goldens[name]["tokenize"][:5]:
        assert tok.encode(case["text"], add_special=False) == case["ids_raw"]
    assert tok._engine is None
