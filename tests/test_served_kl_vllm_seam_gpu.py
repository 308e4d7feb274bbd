"""The served KL (advisor.deploy.vllm.served_kl) against the real vLLM's output side: tensors shaped as vLLM's engine
hands them over, per prefill chunk, go through vLLM's own LogprobsProcessor; the KL read from the tensors (the seam)
is the KL read from the lists vLLM builds, and vLLM builds its lists for each chunk's first position only. Needs
vLLM installed (the GPU machines): marked gpu."""

from __future__ import annotations

import types

import pytest
import torch

from advisor.deploy.vllm import served_kl, write_reference

pytestmark = pytest.mark.gpu


class _EngineStandIn:
    """``llm.generate`` as vLLM's front end runs it for a prompt: the engine's tensors (per chunk: the prompt's next
    token first, then every token by rank) handed to vLLM's own LogprobsProcessor, whose lists become the output."""

    def __init__(self, logprobs_module, table: torch.Tensor, chunk: int) -> None:
        from vllm.logprobs import create_prompt_logprobs
        from vllm.v1.outputs import LogprobsTensors

        self.module, self.table, self.chunk = logprobs_module, table, chunk
        self.tensors, self.create = LogprobsTensors, create_prompt_logprobs
        self.rows_listed: list[int] = []

    def generate(self, prompts, params, use_tqdm=True):
        assert params.prompt_logprobs == -1 and params.flat_logprobs
        (prompt,) = prompts
        ids = torch.tensor(prompt["prompt_token_ids"])
        lp = torch.log_softmax(self.table[ids[:-1]], -1)
        top = torch.topk(lp, lp.shape[1], dim=-1)
        nxt = ids[1:, None]
        token_ids, values = torch.cat([nxt, top.indices], 1), torch.cat([lp.gather(1, nxt), top.values], 1)
        ranks = (lp > lp.gather(1, nxt)).sum(1) + 1
        processor = self.module.LogprobsProcessor(
            tokenizer=None, logprobs=None, cumulative_logprob=None, num_logprobs=None,
            prompt_logprobs=self.create(True), num_prompt_logprobs=-1)
        for s in range(0, lp.shape[0], self.chunk):
            processor._update_prompt_logprobs(self.tensors(token_ids[s:s + self.chunk], values[s:s + self.chunk],
                                                           ranks[s:s + self.chunk]))
        listed = processor.pop_prompt_logprobs()
        self.rows_listed.append(len(listed.start_indices) - 1)
        return [types.SimpleNamespace(prompt_logprobs=listed)]


@pytest.mark.parametrize("chunk", [1000, 16, 1])
def test_the_kl_read_from_vllms_tensors_is_the_kl_read_from_its_lists(chunk, tmp_path):
    vllm = pytest.importorskip("vllm")
    logprobs = pytest.importorskip("vllm.v1.engine.logprobs")

    vocab = 1000
    gen = torch.Generator().manual_seed(0)
    served_table, ref_table = (torch.randn(vocab, vocab, generator=gen) * 3 for _ in range(2))
    sequences = [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in (41, 9)]
    reference = write_reference(tmp_path / "ref.pt", [torch.log_softmax(ref_table[list(s[:-1])], -1)
                                                      for s in sequences])
    original = logprobs.LogprobsProcessor._update_prompt_logprobs

    seam = _EngineStandIn(logprobs, served_table, chunk)
    read = served_kl(vllm, seam, sequences, str(reference), vocab)
    no_seam = types.SimpleNamespace(SamplingParams=vllm.SamplingParams, __version__=vllm.__version__)
    lists = _EngineStandIn(logprobs, served_table, chunk)
    built = served_kl(no_seam, lists, sequences, str(reference), vocab)

    assert (read["read"], built["read"]) == ("tensors", "lists")
    assert read["positions"] == built["positions"] == [40, 8] and read["kl"] > 0
    assert read["kl_sums"] == pytest.approx(built["kl_sums"], rel=1e-12)
    assert lists.rows_listed == [40, 8]  # vLLM's own lists: every position
    assert seam.rows_listed == [-(-n // chunk) for n in (40, 8)]  # through the seam: a chunk's first position only
    assert logprobs.LogprobsProcessor._update_prompt_logprobs is original
