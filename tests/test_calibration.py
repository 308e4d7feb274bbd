"""Calibration tokens from chat conversations rendered with the model's chat template."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_MODEL, TINY_TEXT, need

from advisor.calibration.tokens import build_token_sets, is_chat_source
from advisor.errors import InputError
from advisor.recipe.schema import CalibrationSpec, validate_recipe

SPEC = {"num_samples": 2, "seq_len": 16, "heldout_samples": 1, "heldout_seq_len": 16}


def conversations(n: int = 6) -> list[dict]:
    stories = need(TINY_TEXT).read_text().split("\n\n")
    return [{"messages": [{"role": "user", "content": "Tell me a story."},
                          {"role": "assistant", "content": " ".join(s.split()[:40])}]} for s in stories[:n]]


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def tiny_tokenizer_with_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(need(TINY_MODEL)))
    tok.chat_template = "{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}"
    return tok


def test_chat_rows_are_rendered_with_the_chat_template_and_split_without_overlap(tmp_path):
    rows = conversations()
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    tok = tiny_tokenizer_with_template()
    sets = build_token_sets(None, tok, CalibrationSpec(source=f"chat:{path}", **SPEC))
    expected = []
    for r in rows:
        rendered = tok.apply_chat_template(r["messages"], tokenize=True)
        expected += rendered if isinstance(rendered, list) else rendered["input_ids"]
    assert sets.calibration.flatten().tolist() == expected[:32]
    assert sets.heldout.flatten().tolist() == expected[32:48]  # later tokens, never the calibration ones
    assert sets.source.startswith("chat:") and "chat template" in sets.source
    # the same file without the prefix is detected by its `messages` field
    assert is_chat_source(str(path)) and not is_chat_source(str(need(TINY_TEXT)))
    again = build_token_sets(None, tok, CalibrationSpec(source=str(path), **SPEC))
    assert torch.equal(again.calibration, sets.calibration)


def test_chat_data_needs_a_template_and_messages(tmp_path):
    from transformers import AutoTokenizer

    path = write_jsonl(tmp_path / "chats.jsonl", conversations())
    plain = AutoTokenizer.from_pretrained(str(need(TINY_MODEL)))
    plain.chat_template = None
    with pytest.raises(InputError, match="chat template"):
        build_token_sets(None, plain, CalibrationSpec(source=f"chat:{path}", **SPEC))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user"}]}])
    with pytest.raises(InputError, match="row 1 has no 'messages' list"):
        build_token_sets(None, tiny_tokenizer_with_template(), CalibrationSpec(source=f"chat:{bad}", **SPEC))


def test_recipe_accepts_chat_sources_only_for_jsonl():
    assert validate_recipe({"calibration": {"source": "chat:data/chats.jsonl"}}).calibration.source.startswith("chat:")
    with pytest.raises(InputError, match="chat: needs a .jsonl"):
        validate_recipe({"calibration": {"source": "chat:data/chats.txt"}})


def test_smollm2_instruct_template_marks_every_turn(tmp_path):
    """The demo model's own template (ChatML): each turn opens with <|im_start|>."""
    from transformers import AutoTokenizer

    from advisor.models.loading import resolve_source
    from advisor.recipe.schema import ModelSpec

    where, gguf = resolve_source(ModelSpec())
    tok = AutoTokenizer.from_pretrained(where, gguf_file=gguf)
    rows = conversations(12)
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    sets = build_token_sets(None, tok, CalibrationSpec(source=str(path), num_samples=4, seq_len=64,
                                                        heldout_samples=2, heldout_seq_len=64))
    start = tok.convert_tokens_to_ids("<|im_start|>")
    ids = torch.cat([sets.calibration.flatten(), sets.heldout.flatten()]).tolist()
    assert ids.count(start) >= 2 * 3  # user + assistant (+ a default system turn) per conversation
    text = tok.decode(sets.calibration[0])
    assert "<|im_start|>user" in text or "<|im_start|>assistant" in text


@pytest.mark.parametrize("heldout_len", [16, 12])
def test_self_sampled_sets_are_seeded_and_distinct(heldout_len):
    from transformers import AutoTokenizer

    from advisor.testing import random_model, tiny_llama_config

    model = random_model(tiny_llama_config())
    tok = AutoTokenizer.from_pretrained(str(need(TINY_MODEL)))
    tok.bos_token_id = 1
    spec = CalibrationSpec(**{**SPEC, "num_samples": 3, "heldout_samples": 2, "heldout_seq_len": heldout_len})
    first, again = build_token_sets(model, tok, spec), build_token_sets(model, tok, spec)
    assert first.calibration.shape == (3, 16) and first.heldout.shape == (2, heldout_len)
    assert torch.equal(first.calibration, again.calibration) and torch.equal(first.heldout, again.heldout)
    assert (first.calibration[:, 0] == 1).all() and (first.heldout[:, 0] == 1).all()
    rows = {tuple(r.tolist()) for r in first.calibration}
    assert not any(tuple(r.tolist()) in rows for r in first.heldout)  # sampled rows, not copies


def test_sets_sampled_in_one_batch_are_each_sampled_alone():
    """The calibration and held-out sets decode together; each keeps its own seeded draws (and length)."""
    from transformers import AutoTokenizer

    from advisor.calibration.tokens import sample_from_model, sample_sets_from_model
    from advisor.testing import random_model, tiny_llama_config

    model = random_model(tiny_llama_config()).float()
    tok = AutoTokenizer.from_pretrained(str(need(TINY_MODEL)))
    tok.bos_token_id = 1
    together = sample_sets_from_model(model, tok, [(3, 16, 0), (2, 11, 7)])
    alone = [sample_from_model(model, tok, 3, 16, 0), sample_from_model(model, tok, 2, 11, 7)]
    assert [t.shape for t in together] == [(3, 16), (2, 11)]
    assert all(torch.equal(a, b) for a, b in zip(together, alone, strict=True))


@pytest.mark.parametrize("damage", [b"\x80garbage", b"", "truncated"])
def test_a_damaged_token_file_is_said_to_hold_no_token_sets(tmp_path, damage):
    from advisor.calibration.tokens import TokenSets

    path = tmp_path / "tokens.pt"
    TokenSets(torch.zeros(2, 4, dtype=torch.int64), torch.ones(1, 4, dtype=torch.int64), "self").save(path)
    assert TokenSets.load(path).source == "self"
    path.write_bytes(path.read_bytes()[:40] if damage == "truncated" else damage)
    with pytest.raises(ValueError, match="holds no token sets"):
        TokenSets.load(path)
