"""--engine vllm and `advisor verify`, against a fake ``vllm`` module shaped like vLLM 0.26's offline API
(advisor.testing_vllm): the steady load and its meter, the formats read from the loaded model, the
full-vocabulary served KL, the child process, and the verify command's exits and files."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from advisor.deploy.engines import measured_tier
from advisor.deploy.vllm import (
    ServeJob,
    VllmEnergyModel,
    cpu_ticks,
    dense_logprobs,
    kl_sum,
    run_in_child,
    serve,
    served_formats,
    served_kl,
    steal_pct,
    write_reference,
)
from advisor.engines import ENGINE_TABLE, import_engine
from advisor.errors import AdvisorError, SetupError, UnsupportedError
from advisor.formats import GPU, Format
from advisor.plan import Plan
from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

FAST = {"warmup_s": 0.5, "min_window_s": 0.3, "min_ticks": 20, "repeats": 3, "idle_s": 0.05, "max_cv": 0.2}
GROUPS = [f"layers.{i}.{k}" for i in range(2) for k in ("qkv", "o", "gate_up", "down")]
LEAVES = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
          "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
MEMBERS = {g: tuple(f"model.{g.rsplit('.', 1)[0]}.{leaf}" for leaf in LEAVES[g.rsplit(".", 1)[1]]) for g in GROUPS}


def checkpoint(path, algo=None, exclude=()):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "vocab_size": 64}))
    if algo:
        (path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": algo,
                                                                              "exclude_modules": list(exclude)}}))
    return path


def test_every_graph_up_to_the_bound_where_the_job_asks_for_them(tmp_path, monkeypatch):
    vllm = fake_vllm(step_s=0.002)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, meter=FAST, needed_graphs_only=False,
                   workloads=({"name": "chat", "batch_size": 4, "input_tokens": 8, "output_tokens": 16},))
    serve(job, make_counter=lambda: ConstantPowerCounter(300.0))
    assert vllm.instances[0].kwargs["compilation_config"] == {"max_cudagraph_capture_size": 16}


def test_engines_are_one_table_and_vllm_is_an_entry(monkeypatch):
    assert set(ENGINE_TABLE) == {"builtin", "tensorrt_llm", "vllm"}
    assert measured_tier("builtin") is None
    assert measured_tier("vllm").__name__ == "vllm_tier"
    assert "cannot be installed" in ENGINE_TABLE["tensorrt_llm"].note
    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable
    with pytest.raises(SetupError, match=r"pip install vllm==0\.26\.0"):
        import_engine("vllm")


def test_steady_load_keeps_the_batch_full_with_fresh_prompts(tmp_path, monkeypatch):
    vllm = fake_vllm(step_s=0.002)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, meter=FAST,
                   workloads=({"name": "chat", "batch_size": 4, "input_tokens": 8, "output_tokens": 16},))
    out = serve(job, make_counter=lambda: ConstantPowerCounter(300.0))
    llm = vllm.instances[0]
    assert llm.kwargs["enable_prefix_caching"] is False and llm.kwargs["max_num_seqs"] == 4
    # the steps where an 8-token prefill joins 4 decodes are captured, as the export's vllm_config.yaml asks, and
    # only the graphs the loads run: 4 decodes, 3 decodes + 8 prefill tokens (11 -> 16), and batch 1's (prefill)
    assert llm.kwargs["compilation_config"] == {"cudagraph_capture_sizes": [1, 4, 8, 16]} == out["llm_options"][
        "compilation_config"]
    assert out["timings_s"]["engine_start_s"] >= 0 and [m["batch"] for m in out["timings_s"]["meterings"]] == [4]
    row = out["energy"]["chat"]
    assert row["batch_full"] and llm.llm_engine.most_running == 4
    prompts = llm.llm_engine.prompts
    assert len(prompts) > 20 and len(set(prompts)) == len(prompts)  # a fresh random prompt per request
    # 4 tokens per step of >= 2 ms: at most 2000 tokens/s; a constant 300 W gives J/token = 300 / tokens/s
    assert 500 < row["tokens_per_s"] < 2000
    assert row["j_per_token"] == pytest.approx(300.0 / row["tokens_per_s"], rel=0.1)
    assert 0 < row["prefill_j_per_input_token"] < row["j_per_token"]
    # every request of the steady load gets one token per step of >= 2 ms: TPOT ~ one step, TTFT a step or two
    assert row["latency_requests"] > 5
    assert 2.0 <= row["tpot_ms_p50"] <= row["tpot_ms_p90"] < 20.0
    assert 0.0 < row["ttft_ms_p50"] <= row["ttft_ms_p90"] < 40.0
    # the host the engine's steps ran on, and how busy it was before and after the meterings
    host = out["host"]
    assert host["cpus"] == os.cpu_count() and host["cpu"] and host["cpu"] != "unknown"
    assert host["load_1m"] >= 0 and host["load_1m_after"] >= 0
    assert host["torch"] == torch.__version__ and host["cuda"] == torch.version.cuda
    assert 0.0 <= host["steal_pct"] <= 100.0  # the CPU time the hypervisor took over the meterings
    assert row["gpu_busy_pct"] is None and row["gpu_busy_pct_low"] is None  # a counter given alone: no utilization
    # the load's own token count per 0.1 s, on the meter's clock: each window's tokens are the trace's over its span
    trace = row["token_trace"]
    bins, start, width = trace["tokens"], trace["start_s"], trace["bin_s"]
    assert width == 0.1 and all(n >= 0 for n in bins) and sum(bins) > 0
    for w in row["measurement"]["windows"]:
        first, last = (int((w["began_s"] - start) / width), int((w["began_s"] + w["time_s"] - start) / width))
        inside, around = sum(bins[first + 1:last]), sum(bins[first:last + 1])
        assert inside - 8 <= w["steps"] <= around + 8  # to a bin's edge and a step's 4 tokens, either side


def test_each_row_says_how_busy_the_gpu_was_over_its_load(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(step_s=0.002))
    readings = iter([60.0, None, 100.0] * 10_000)  # NVML's utilization, once in a while not said
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, meter=FAST, prefill=False,
                   workloads=({"name": "chat", "batch_size": 4, "input_tokens": 8, "output_tokens": 16},))
    out = serve(job, make_counter=lambda: ConstantPowerCounter(300.0), make_busy=lambda: lambda: next(readings))
    row = out["energy"]["chat"]
    assert row["gpu_busy_pct_low"] == 60.0 and 60.0 < row["gpu_busy_pct"] < 100.0  # the readings said, averaged
    assert row["other_gpus_busy_pct"] is None  # the fake counter is not NVML's: no other GPU read
    assert row["measurement"]["idle_power_w"] is None  # not read beside the live load (it cost a second a metering)

    beside = iter([40.0, 20.0] * 10_000)  # another job on the host's other GPU
    out = serve(job, make_counter=lambda: ConstantPowerCounter(300.0), make_busy=lambda: lambda: 100.0,
                make_others=lambda: lambda: next(beside))
    assert 20.0 <= out["energy"]["chat"]["other_gpus_busy_pct"] <= 40.0


def test_every_metering_runs_with_the_heap_frozen_as_vllm_s_own_server_runs(tmp_path, monkeypatch):
    import gc

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(step_s=0.002))
    frozen_while_metered: list[int] = []

    class Watching(ConstantPowerCounter):  # reads the collector's frozen objects each time the meter reads energy
        def energy_mj(self) -> int:
            frozen_while_metered.append(gc.get_freeze_count())
            return super().energy_mj()

    workloads = ({"name": "chat", "batch_size": 4, "input_tokens": 8, "output_tokens": 16},
                 {"name": "long", "batch_size": 2, "input_tokens": 8, "output_tokens": 16})
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, meter=FAST, prefill=False,
                   workloads=workloads)
    assert gc.get_freeze_count() == 0
    out = serve(job, make_counter=lambda: Watching(300.0))
    frozen = out["host"]["gc_frozen_objects"]
    # torch's and the advisor's imports, through both loads (a frozen object that is freed leaves the count)
    assert frozen > 1000 and frozen_while_metered and min(frozen_while_metered) > 0.9 * frozen
    assert gc.get_freeze_count() == 0  # given back once the meterings are over


def test_steal_is_the_share_of_all_cpu_ticks_the_hypervisor_took():
    assert steal_pct((10, 1000), (60, 2000)) == 5.0
    assert steal_pct(None, (60, 2000)) is None and steal_pct((10, 1000), (10, 1000)) is None
    stolen, total = cpu_ticks()  # this machine's own /proc/stat
    assert 0 <= stolen <= total


def test_formats_as_served_name_every_group_served_otherwise(tmp_path, monkeypatch):
    vllm = fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    plan = Plan({g: Format.BF16 if g.startswith("layers.0.") else Format.FP8 for g in GROUPS})
    ck = checkpoint(tmp_path / "ck", "FP8", exclude=["model.layers.0.*"])
    served = serve(ServeJob(str(ck), vocab_size=64))["served"]
    formats, differ = served_formats(served, plan, MEMBERS)
    assert differ == {} and formats == {g: f.value for g, f in plan.formats.items()}

    vllm.misserve = {"model.layers.1.mlp.gate_up_proj": "UnquantizedLinearMethod",
                     "model.layers.1.mlp.down_proj": "ModelOptNvFp4W4A16LinearMethod"}
    served = serve(ServeJob(str(ck), vocab_size=64))["served"]
    _, differ = served_formats(served, plan, MEMBERS)
    assert differ == {"layers.1.gate_up": "planned fp8, served bf16",
                      "layers.1.down": "planned fp8, served ModelOptNvFp4W4A16LinearMethod"}


def test_served_log_probabilities_are_every_token_at_every_position_flat_or_not(tmp_path):
    from advisor.testing_vllm import bigram_table

    vllm = fake_vllm(noise=0.0)
    llm = vllm.LLM(str(checkpoint(tmp_path / "ck")), max_logprobs=-1)
    seq = [3, 9, 1, 60, 3]
    table = torch.log_softmax(bigram_table(64), -1)
    for flat in (True, False):
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=-1, flat_logprobs=flat)
        dense = dense_logprobs(llm.generate([{"prompt_token_ids": seq}], params)[0].prompt_logprobs, 64)
        assert torch.equal(dense, table[seq[:-1]])  # position i: the next-token log-probabilities after token i
    top = llm.generate([{"prompt_token_ids": seq}], vllm.SamplingParams(prompt_logprobs=5, flat_logprobs=True))
    with pytest.raises(AdvisorError, match="fewer than all 64 log-probabilities at 4 of 4 positions"):
        dense_logprobs(top[0].prompt_logprobs, 64)
    heard = []
    reference = write_reference(tmp_path / "ref.pt", [table[seq[:-1]], table[seq[:-1]]])
    kl = served_kl(vllm, llm, [seq, seq], str(reference), 64, say=heard.append, every_s=0.0)
    assert kl["kl"] == pytest.approx(0.0, abs=1e-7) and kl["positions"] == [4, 4]
    assert [m.split(" (")[0] for m in heard] == ["served KL: 1 of 2 held-out sequences scored",
                                                 "served KL: 2 of 2 held-out sequences scored"]
    capped = vllm.LLM(str(checkpoint(tmp_path / "ck2")))  # vLLM's default cap of 20 refuses the whole vocabulary
    with pytest.raises(ValueError, match="greater than max allowed: 20"):
        capped.generate([{"prompt_token_ids": seq}], vllm.SamplingParams(prompt_logprobs=-1))


def test_a_reference_file_cut_off_by_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    import errno

    def save_half(obj, path):
        path.write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_half)
    with pytest.raises(OSError, match="No space left"):
        write_reference(tmp_path / "ref.pt", [torch.zeros(2, 4)])
    assert list(tmp_path.iterdir()) == []


def test_a_job_of_held_out_tokens_and_items_alone_fits_the_engine_s_length(tmp_path, monkeypatch):
    # no workload to size the engine: the longest sequence is a prompt of one more token (it failed on an H200)
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm())
    seqs = (tuple(range(1, 41)),)
    reference = write_reference(tmp_path / "ref.pt", [torch.log_softmax(torch.zeros(39, 64), -1)])
    out = serve(ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, sequences=seqs, reference_logprobs=str(
        reference), items=((tuple(range(1, 30)), tuple(range(30, 41))),), formats=False))
    assert out["served_kl"]["positions"] == [39] and len(out["items"]) == 1


def test_served_kl_is_the_full_kl_and_grows_with_the_quantized_share(tmp_path, monkeypatch):
    from advisor.testing_vllm import bigram_table

    vllm = fake_vllm(noise=1.0)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    seqs = (tuple(range(0, 40)), tuple(range(20, 60)))
    ref_table = torch.log_softmax(bigram_table(64), -1)
    reference = write_reference(tmp_path / "ref.pt", [ref_table[list(s[:-1])] for s in seqs])
    kls = []
    for name, algo, exclude in (("bf16", None, ()), ("half", "FP8", ["model.layers.0.*"]), ("fp8", "FP8", ())):
        out = serve(ServeJob(str(checkpoint(tmp_path / name, algo, exclude)), vocab_size=64, sequences=seqs,
                             reference_logprobs=str(reference)))
        assert vllm.instances[-1].kwargs["max_logprobs"] == -1 and out["served_kl"]["positions"] == [39, 39]
        # the served model's own full log-softmax, scored here, gives the same KL
        served = torch.log_softmax(vllm.instances[-1].logits, -1)
        full = sum(kl_sum(ref_table[list(s[:-1])], served[list(s[:-1])]) for s in seqs) / 78
        assert out["served_kl"]["kl"] == pytest.approx(full, rel=1e-5, abs=1e-9)
        kls.append(out["served_kl"]["kl"])
    assert kls[0] == pytest.approx(0.0, abs=1e-9) and 0 < kls[1] < kls[2]


def test_the_served_kl_reads_vllms_tensors_chunk_by_chunk_and_gets_what_its_lists_give(tmp_path):
    """vLLM's output side makes Python lists of 16M entries a sequence at a 128k vocabulary; the served KL takes the
    tensors it is handed instead, one per prefill chunk, and scores the same KL as from the lists. The hook is gone
    after the scoring, and a vLLM without it is read from the lists."""
    from advisor.testing_vllm import bigram_table

    vllm = fake_vllm(noise=1.0)
    llm = vllm.LLM(str(checkpoint(tmp_path / "ck", "FP8")), max_logprobs=-1)
    seqs = [tuple(range(0, 40)), (5, 9, 63, 2, 2, 17)]
    ref_table = torch.log_softmax(bigram_table(64), -1)
    reference = str(write_reference(tmp_path / "ref.pt", [ref_table[list(s[:-1])] for s in seqs]))
    processor = vllm.v1.engine.logprobs.LogprobsProcessor
    original = processor._update_prompt_logprobs
    outs = {}
    for chunk in (1 << 30, 7, 1):  # one chunk a prompt, several, one a position
        vllm.prompt_chunk = chunk
        outs[chunk] = served_kl(vllm, llm, seqs, reference, 64)
        assert processor._update_prompt_logprobs is original
    del vllm.v1  # a vLLM whose output side has no such method (the fake still serves through its own)
    lists = served_kl(vllm, llm, seqs, reference, 64)
    assert lists["read"] == "lists" and all(o["read"] == "tensors" for o in outs.values())
    for out in outs.values():
        assert out["positions"] == lists["positions"] == [39, 5]
        assert out["kl_sums"] == pytest.approx(lists["kl_sums"], rel=1e-12) and out["kl"] > 0


def test_two_threads_scoring_at_once_each_read_their_own_tensors(tmp_path):
    """verify --workers serves plans at once; where they share a process (threads), each scoring reads the tensors
    of its own prompts, and a thread that does not score gets vLLM's own lists. Both threads are held inside
    vLLM's method at the same time."""
    import threading

    from advisor.testing_vllm import bigram_table

    vllm = fake_vllm(noise=1.0)
    processor = vllm.v1.engine.logprobs.LogprobsProcessor
    lists_of, inside = processor._update_prompt_logprobs, threading.Barrier(3, timeout=30)

    def held(self, tensors):
        inside.wait()
        lists_of(self, tensors)

    processor._update_prompt_logprobs = held
    ref_table = torch.log_softmax(bigram_table(64), -1)
    seqs = {"a": tuple(range(0, 40)), "b": (5, 9, 63, 2, 2, 17)}
    refs = {k: str(write_reference(tmp_path / f"{k}.pt", [ref_table[list(s[:-1])]])) for k, s in seqs.items()}
    llms = {k: vllm.LLM(str(checkpoint(tmp_path / k, "FP8")), max_logprobs=-1) for k in seqs}
    got: dict[str, object] = {}

    def score(k):
        got[k] = served_kl(vllm, llms[k], [seqs[k]], refs[k], 64)

    def lists():  # not scoring: vLLM's lists of every position
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=-1, flat_logprobs=True)
        got["lists"] = dense_logprobs(llms["a"].generate([{"prompt_token_ids": seqs["a"]}], params)[0].prompt_logprobs,
                                      64)

    threads = [threading.Thread(target=score, args=(k,)) for k in seqs] + [threading.Thread(target=lists)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert processor._update_prompt_logprobs is held
    processor._update_prompt_logprobs = lists_of
    for k in seqs:  # alone, afterwards
        alone = served_kl(vllm, llms[k], [seqs[k]], refs[k], 64)
        assert got[k]["read"] == "tensors" and got[k]["positions"] == [len(seqs[k]) - 1]
        assert got[k]["kl_sums"] == pytest.approx(alone["kl_sums"], rel=1e-12)
    assert got["lists"].shape == (39, 64)


def test_the_served_kl_refuses_tensors_that_disagree_with_vllms_own_lists(tmp_path):
    """A vLLM whose output side makes of the tensors something else than 0.26 does (here: it negates them) is
    caught by the check against its own lists, and the hook is gone after the error."""
    vllm = fake_vllm()
    processor = vllm.v1.engine.logprobs.LogprobsProcessor
    lists_of = processor._update_prompt_logprobs

    def otherwise(self, tensors):
        lists_of(self, type(tensors)(tensors[0], -tensors[1], tensors[2]))

    processor._update_prompt_logprobs = otherwise
    llm = vllm.LLM(str(checkpoint(tmp_path / "ck")), max_logprobs=-1)
    seq = (1, 2, 3, 4)
    ref = torch.zeros(3, 64)
    reference = str(write_reference(tmp_path / "ref.pt", [ref]))
    with pytest.raises(AdvisorError, match=r"tensors disagree with the lists vLLM made of them: this vLLM \(0\.0-fake"):
        served_kl(vllm, llm, [seq], reference, 64)
    assert processor._update_prompt_logprobs is otherwise


def test_the_engine_runs_in_a_child_process(tmp_path, monkeypatch):
    (tmp_path / "pkgs" / "vllm").mkdir(parents=True)
    (tmp_path / "pkgs" / "vllm" / "__init__.py").write_text(
        "import sys\nfrom advisor.testing_vllm import fake_vllm\nsys.modules[__name__] = fake_vllm()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    out = run_in_child(ServeJob(str(checkpoint(tmp_path / "ck", "FP8")), vocab_size=64))
    assert out["vllm_version"] == "0.0-fake"
    assert out["served"]["model.layers.0.self_attn.qkv_proj"]["method"] == "ModelOptFp8LinearMethod"
    with pytest.raises(UnsupportedError, match="could not serve .*FileNotFoundError"):
        run_in_child(ServeJob(str(tmp_path / "missing"), vocab_size=64))


def test_without_vllm_the_child_says_how_to_install_it(tmp_path):
    pytest.importorskip("torch")
    if "vllm" in sys.modules or any((p / "vllm").exists() for p in map(__import__("pathlib").Path, sys.path)):
        pytest.skip("a vllm package is importable here")
    with pytest.raises(SetupError, match=r"vllm.*pip install vllm==0\.26\.0"):
        run_in_child(ServeJob(str(tmp_path), vocab_size=64))


def test_measure_chooses_the_engine_and_vllm_needs_the_checkpoint(tmp_path):
    from typer.testing import CliRunner

    from advisor.cli import app

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"formats": {}}))
    runner = CliRunner()
    res = runner.invoke(app, ["measure", "--plan", str(plan), "--engine", "vllm"])
    assert res.exit_code == 2 and "--engine vllm serves an exported checkpoint" in res.output
    res = runner.invoke(app, ["measure", "--plan", str(plan), "--engine", "sglang"])
    assert res.exit_code == 2 and "builtin or vllm" in res.output


def test_measure_with_an_objective_meters_the_plans_operating_point(tmp_path, monkeypatch):
    from conftest import TINY_MODEL, need
    from typer.testing import CliRunner

    from advisor.cli import app
    from advisor.cli.energy import shape_from_model
    from advisor.energy.meter import MeterConfig

    vllm = fake_vllm(step_s=0.001)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.cli.energy.gpu_here", lambda: (None, "Fake GPU"))
    monkeypatch.setattr("advisor.deploy.vllm._engine.run_in_child",
                        lambda job: serve(job, make_counter=ConstantPowerCounter))
    monkeypatch.setattr("advisor.deploy.vllm._engine.MeterConfig", lambda: MeterConfig(**FAST))
    model = need(TINY_MODEL)
    plan = tmp_path / "plan.json"
    plan.write_text(Plan.uniform(shape_from_model(str(model)).groups, Format.FP8).to_json())
    ck = checkpoint(tmp_path / "ck", "FP8")
    args = ["measure", "--plan", str(plan), "--model", str(model), "--engine", "vllm", "--checkpoint", str(ck),
            "--batch", "2", "--input-tokens", "8", "--output-tokens", "8", "--target", "h100"]
    res = CliRunner().invoke(app, [*args, "--tpot-ms", "1000", "--max-concurrency", "6"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["workload"] == "cli" and out["measured"]  # the stated batch, as before
    op = out["operating_point"]
    assert op["predicted"]["batch"] == 6 and op["predicted"]["bound"] == "max_concurrency"
    assert op["predicted"]["source"].startswith("predicted")
    m = op["measured"]
    assert m["batch"] == 6 and m["workload"] == "cli" and m["source"].startswith("measured (vLLM 0.0-fake")
    assert [llm.kwargs["max_num_seqs"] for llm in vllm.instances] == [6]  # both batches served by one engine
    assert m["predicted_batch"] == 6 and m["search"] == "meets at the predicted batch 6" and len(m["trail"]) == 1
    # steps that grow with the batch: batch 6 misses 1.5 ms as measured, smaller batches are metered in one engine
    vllm.step_s, vllm.step_s_per_seq = 0.0002, 0.0003
    monkeypatch.setattr("advisor.deploy.vllm._engine.MeterConfig",
                        lambda: MeterConfig(**{**FAST, "warmup_s": 0.5}))  # busy CI
    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds",
                        lambda job, more: serve(job, make_counter=ConstantPowerCounter, more=more))
    res = CliRunner().invoke(app, [*args, "--tpot-ms", "1.5", "--max-concurrency", "6"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.output[res.output.index("{"):])["operating_point"]["measured"]
    assert m["predicted_batch"] == 6 and m["trail"][0]["batch"] == 6 and m["trail"][0]["meets"] is False
    assert m["meets"] is True and m["batch"] < 6 and m["tpot_ms"] <= 1.5 and len(vllm.instances) == 3
    res = CliRunner().invoke(app, [*args, "--tpot-ms", "10", "--ttft-ms", "5"])
    assert res.exit_code == 2 and res.output.count("Error:") == 1 and "ttft_ms 5 is below tpot_ms 10" in res.output


def test_the_capture_bound_follows_the_job_and_an_explicit_compilation_config_wins(tmp_path, monkeypatch):
    vllm = fake_vllm(step_s=0.0)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    ck = str(checkpoint(tmp_path / "ck"))
    explicit = {"compilation_config": {"max_cudagraph_capture_size": 128}}
    for job in (ServeJob(ck, vocab_size=64, formats=False, prefill=False),  # no workload: batch 16, no prompt
                ServeJob(ck, vocab_size=64, formats=False, prefill=False, as_exported=False),
                ServeJob(ck, vocab_size=64, formats=False, prefill=False, llm_options=explicit)):
        serve(job, make_counter=lambda: ConstantPowerCounter(300.0))
    default, off, given = (llm.kwargs.get("compilation_config") for llm in vllm.instances)
    assert default == {"max_cudagraph_capture_size": 16} and off is None and given == explicit["compilation_config"]
    from advisor.deploy.checkpoint import capture_bound

    assert capture_bound(64, 512) == 576 and capture_bound(64, 500) == 576 and capture_bound(1, 1) == 16


@pytest.mark.parametrize("gpu", [GPU.H100, GPU.H200, GPU.B200, None])
def test_fp8_gemms_are_served_by_cublaslt_on_hopper_as_the_export_says(tmp_path, monkeypatch, gpu):
    vllm = fake_vllm(step_s=0.0)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.deploy.vllm._serve.gpu_kind", lambda: gpu)
    fp8, bf16 = str(checkpoint(tmp_path / "fp8", "FP8")), str(checkpoint(tmp_path / "bf16"))
    nvfp4 = checkpoint(tmp_path / "nvfp4")
    (nvfp4 / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "MIXED_PRECISION", "quantized_layers": {"model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4"},
                                                              "model.layers.1.mlp.down_proj": {"quant_algo": "FP8"}}}}))
    cutlass = {"linear_backend": "auto"}
    for job in (ServeJob(fp8, vocab_size=64, formats=False, prefill=False),
                ServeJob(bf16, vocab_size=64, formats=False, prefill=False),
                ServeJob(str(nvfp4), vocab_size=64, formats=False, prefill=False),  # would be refused with torch
                ServeJob(fp8, vocab_size=64, formats=False, prefill=False, as_exported=False),
                ServeJob(fp8, vocab_size=64, formats=False, prefill=False, llm_options=cutlass)):
        out = serve(job, make_counter=lambda: ConstantPowerCounter(300.0))
    fp8_served, bf16_served, nvfp4_served, defaults, explicit = (llm.kwargs.get("linear_backend")
                                                                 for llm in vllm.instances)
    assert fp8_served == ("torch" if gpu in (GPU.H100, GPU.H200) else None)
    assert bf16_served is nvfp4_served is defaults is None
    assert explicit == "auto" == out["llm_options"]["linear_backend"]
    with pytest.raises(ValueError, match="no 'torch' kernel"):  # the fake refuses it, as vLLM does
        serve(ServeJob(str(nvfp4), vocab_size=64, formats=False, prefill=False,
                       llm_options={"linear_backend": "torch"}))


@pytest.mark.parametrize("gpu", [GPU.H200, GPU.B200])
def test_fp8_experts_are_served_by_vllm_s_triton_kernel_on_hopper_as_the_export_says(tmp_path, monkeypatch, gpu):
    vllm = fake_vllm(step_s=0.0)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.deploy.vllm._serve.gpu_kind", lambda: gpu)
    moe_config = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
                  "vocab_size": 64}
    fp8_moe, bf16_moe, fp8_dense = checkpoint(tmp_path / "moe8", "FP8"), checkpoint(tmp_path / "moe16"), \
        checkpoint(tmp_path / "dense8", "FP8")
    for ck in (fp8_moe, bf16_moe):
        (ck / "config.json").write_text(json.dumps(moe_config))
    for ck in (fp8_moe, bf16_moe, fp8_dense):
        serve(ServeJob(str(ck), vocab_size=64, formats=False, prefill=False),
              make_counter=lambda: ConstantPowerCounter(300.0))
    served = [llm.kwargs.get("moe_backend") for llm in vllm.instances]
    assert served == ["triton" if gpu == GPU.H200 else None, None, None]


def serve_on_constant_power(job, more=None):
    """A child process's target (module level, so that a spawned process finds it)."""
    return serve(job, make_counter=ConstantPowerCounter, more=more)


def fake_vllm_package(tmp_path, monkeypatch) -> dict:
    """The fake vllm importable in a spawned child (a package on the path); a fast meter's settings."""
    (tmp_path / "pkgs" / "vllm").mkdir(parents=True)
    (tmp_path / "pkgs" / "vllm" / "__init__.py").write_text(
        "import sys\nfrom advisor.testing_vllm import fake_vllm\nsys.modules[__name__] = fake_vllm(step_s=0.001)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    return {"warmup_s": 0.5, "min_window_s": 0.2, "min_ticks": 10, "repeats": 3, "idle_s": 0.02, "max_cv": 0.5}


def test_rounds_run_in_one_child_process_that_asks_for_each(tmp_path, monkeypatch):
    from advisor.deploy.vllm import run_rounds_in_child

    meter = fake_vllm_package(tmp_path, monkeypatch)
    first = {"name": "chat at batch 4", "batch_size": 4, "input_tokens": 8, "output_tokens": 8}
    job = ServeJob(str(checkpoint(tmp_path / "ck", "FP8")), vocab_size=64, workloads=(first,), formats=False,
                   prefill=False, meter=meter, max_batch=4)
    asked = []

    def more(rows):
        asked.append(sorted(rows))
        return [{**first, "name": "chat at batch 2", "batch_size": 2}] if len(asked) == 1 else []

    out = run_rounds_in_child(job, more, "pip install vllm", target=serve_on_constant_power)
    assert asked == [["chat at batch 4"], ["chat at batch 2", "chat at batch 4"]]  # each round's rows, then stop
    assert sorted(out["energy"]) == ["chat at batch 2", "chat at batch 4"] and out["vllm_version"] == "0.0-fake"
    missing = ServeJob(str(tmp_path / "missing"), vocab_size=64, workloads=(first,), meter=meter)
    with pytest.raises(UnsupportedError, match="could not serve .*FileNotFoundError"):
        run_rounds_in_child(missing, more, "pip install vllm", target=serve_on_constant_power)


def serve_and_say_which_gpus(job, more=None):
    """A child's target: the serving, and the GPUs the child was shown."""
    import os

    return {**serve(job, make_counter=ConstantPowerCounter, more=more),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def test_verify_s_whole_serving_opens_the_engine_the_rounds_keep_in_a_child_shown_its_gpus(tmp_path, monkeypatch):
    from advisor.deploy.vllm import VllmEnergyModel, run_rounds_in_child
    from advisor.energy.meter import MeterConfig
    from advisor.recipe.schema import Workload

    meter = fake_vllm_package(tmp_path, monkeypatch)
    ck = checkpoint(tmp_path / "ck")
    stated = Workload(name="chat", batch_size=2, input_tokens=8, output_tokens=8, tpot_ms=5.0)
    operating = stated.model_copy(update={"name": "chat at batch 4", "batch_size": 4})
    job = ServeJob(str(ck), vocab_size=64, workloads=(stated.model_dump(), operating.model_dump()),
                   sequences=((1, 2, 3, 4, 5),), items=(((1, 2, 3), (4,)),), prefill=False, meter=meter,
                   devices=("GPU-fake-1",),
                   reference_logprobs=str(write_reference(tmp_path / "ref.pt", [torch.log_softmax(torch.zeros(4, 64),
                                                                                                  -1)])))
    model = VllmEnergyModel(lambda _plan: ck, [], 64, meter=MeterConfig(**meter), vllm_version="0.0-fake",
                            rounds_runner=lambda j, more: run_rounds_in_child(j, more, "pip install vllm",
                                                                              target=serve_and_say_which_gpus))
    plan = Plan({"model.layers.0": Format.BF16})
    model.open_with(plan, job)
    rounds = []

    def next_round(points):
        rounds.append(sorted(p.batch for p in points))
        return [operating.model_copy(update={"name": "chat at batch 3", "batch_size": 3})] if len(rounds) == 1 else []

    points = model.measure_rounds(plan, [operating], next_round, 4)
    out = model.served(plan)
    assert rounds == [[4], [3]] and [p.batch for p in points] == [4, 3]  # the search's round in the same engine
    assert sorted(out["energy"]) == ["chat", "chat at batch 3", "chat at batch 4"]
    assert out["served_kl"]["positions"] == [4] and out["items"] and out["served"]  # the whole serving came back
    assert out["visible"] == "GPU-fake-1"  # the engine's process saw only the job's GPU


def test_only_the_graphs_the_loads_run_are_captured_and_they_are_the_grid_s_own():
    from advisor.deploy.checkpoint import capture_bound, decode_graph_sizes, graph_sizes_for

    bound = capture_bound(64, 512)
    sizes = graph_sizes_for([16, 64], 512, bound)
    grid = decode_graph_sizes(bound)
    assert set(sizes) <= set(grid)
    assert sizes == (16, 64, 528, 576)  # 16 and 64 decodes; 15 + 512 -> 528, 63 + 512 -> 576
    # each step pads to the same size as under the whole grid
    for tokens in (16, 64, 527, 575):
        assert min(g for g in sizes if g >= tokens) == min(g for g in grid if g >= tokens)
    assert graph_sizes_for([300], 0, 512) == (304,)  # no prefill: decode steps only


def test_the_start_s_stages_are_read_from_vllm_s_log():
    from advisor.deploy.vllm import start_seconds

    log = "\n".join([  # an H100's lines, 2026-11-28 (reports/benchmarks/vllm_verify_data/linear_backend_2026-11-28)
        "(EngineCore pid=2139) INFO [model_runner.py:305] Model loading took 8.54 GiB and 5.644240 seconds",
        "(EngineCore pid=2139) INFO [backends.py:1155] Dynamo bytecode transform time: 17.77 s",
        "(EngineCore pid=2139) INFO [monitor.py:53] torch.compile took 40.76 s in total",
        "(EngineCore pid=2139) INFO [model_runner.py:747] Graph capturing finished in 6 secs, took 0.45 GiB",
        "(EngineCore pid=2139) INFO [core.py:340] init engine (profile, create kv cache, warmup model) took 61.14 s "
        "(compilation: 40.76 s)"])
    assert start_seconds(log) == {"weights_s": 5.64424, "dynamo_s": 17.77, "compile_s": 40.76,
                                  "graph_capture_s": 6.0, "engine_init_s": 61.14}
    assert start_seconds("INFO Loaded AOT compiled function from /root/.cache/vllm/x")["compile_cache_hit"] is True
    # VLLM_USE_AOT_COMPILE=0 (an H200, 2026-11-30: reports/benchmarks/verify_time_data/qwen3_4b_round9)
    no_aot = ("(EngineCore pid=1944) INFO 11-30 08:49:23 [monitor.py:53] torch.compile and initial profiling/warmup "
              "run together took 36.83 s in total")
    assert start_seconds(no_aot) == {"compile_s": 36.83}


def test_the_kernel_warm_up_after_graph_capture_is_timed_from_the_clock_of_vllm_s_lines():
    from advisor.deploy.vllm import start_seconds, start_words

    # an H200's first engine on a fresh machine, 2026-11-29 (reports/benchmarks/verify_time_data/after): nothing
    # is logged while the V2 model runner compiles its Triton kernels
    log = "\n".join([
        "(EngineCore pid=1513) INFO 11-29 10:33:57 [model_runner.py:747] Graph capturing finished in 2 secs, took "
        "0.36 GiB",
        "(EngineCore pid=1513) INFO 11-29 10:35:36 [jit_monitor.py:79] Kernel JIT monitor activated; monitored JIT "
        "compilations during inference will use mode=warn.",
        "(EngineCore pid=1513) INFO 11-29 10:35:37 [core.py:340] init engine (profile, create kv cache, warmup "
        "model) took 133.78 s (compilation: 27.78 s)"])
    stages = start_seconds(log)
    assert stages["kernel_warmup_s"] == 99.0
    assert "kernel warm-up 99 s" in start_words(stages)
    # across midnight; and one line alone names no warm-up
    late = log.replace("10:33:57", "23:59:30").replace("10:35:36", "00:00:10")
    assert start_seconds(late)["kernel_warmup_s"] == 40.0
    assert "kernel_warmup_s" not in start_seconds(log.splitlines()[0])


def test_a_child_s_output_passes_through_and_its_start_lines_are_kept(capfd):
    import subprocess
    import time as _time

    from advisor.deploy.vllm import watch_output

    with watch_output() as start:  # vLLM's engine core logs to the standard output it inherits
        subprocess.run([sys.executable, "-c", "import sys; print('torch.compile took 12.5 s in total'); "
                        "print('Graph capturing finished in 3 secs', file=sys.stderr)"], check=True)
        for _ in range(100):
            if len(start) == 2:
                break
            _time.sleep(0.01)
    assert start == {"compile_s": 12.5, "graph_capture_s": 3.0}
    seen = capfd.readouterr()
    assert "torch.compile took 12.5 s" in seen.out and "Graph capturing finished" in seen.err


def test_the_kernel_warm_up_is_timed_from_two_lines_as_they_pass():
    import subprocess
    import time as _time

    from advisor.deploy.vllm import watch_output

    lines = ("INFO 11-29 10:42:21 [model_runner.py:747] Graph capturing finished in 1 secs",
             "INFO 11-29 10:42:28 [jit_monitor.py:79] Kernel JIT monitor activated; ...")
    with watch_output() as start:
        subprocess.run([sys.executable, "-c", f"print({lines[0]!r}, flush=True); print({lines[1]!r})"], check=True)
        for _ in range(100):
            if "kernel_warmup_s" in start:
                break
            _time.sleep(0.01)
    assert start["kernel_warmup_s"] == 7.0 and start["graph_capture_s"] == 1.0


def test_two_workloads_of_one_load_are_metered_once(tmp_path, monkeypatch):
    vllm = fake_vllm(step_s=0.002)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    same = {"batch_size": 4, "input_tokens": 8, "output_tokens": 16}
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, meter=FAST, prefill=False,
                   workloads=({"name": "tpot12", **same}, {"name": "tpot20", **same}))
    out = serve(job, make_counter=lambda: ConstantPowerCounter(300.0))
    e = out["energy"]
    assert e["tpot20"]["same_load_as"] == "tpot12" and e["tpot20"]["j_per_token"] == e["tpot12"]["j_per_token"]
    assert [m["workload"] for m in out["timings_s"]["meterings"]] == ["tpot12"]


def test_a_label_says_when_the_meter_left_out_windows_a_host_stall_starved(tmp_path):
    from advisor.formats import Format
    from advisor.plan import Plan
    from advisor.recipe.schema import Workload

    w = Workload(name="chat", input_tokens=512, output_tokens=256, batch_size=64)
    row = {"j_per_token": 0.07, "tokens_per_s": 9e3, "fewest_inflight": 64, "batch_full": True,
           "measurement": {"unstable": False, "starved_windows": 6}}

    def estimate(measurement):
        served = {"energy": {"chat": {**row, "measurement": measurement}}}
        model = VllmEnergyModel(lambda _plan: tmp_path, [w], 64, runner=lambda _job: served, vllm_version="0.26.0")
        return model.estimate(Plan.uniform((), Format.BF16), w).source

    assert estimate(row["measurement"]).endswith(
        "; 6 starved window(s) left out (less power at less throughput: the host stalled)")
    assert "starved" not in estimate({"unstable": False, "starved_windows": 0})
    assert "starved" not in estimate({"unstable": False})  # a serving kept before the meter counted them


def test_a_held_serving_without_a_go_is_refused_before_it_meters(tmp_path, monkeypatch):
    """A held job meters only once more({}) answers; without more it would meter beside the exports."""
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm())
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, hold=True,
                   workloads=({"name": "chat", "batch_size": 2, "input_tokens": 8, "output_tokens": 4},))
    with pytest.raises(SetupError, match="a held serving meters only once"):
        serve(job, make_counter=ConstantPowerCounter)


def test_a_loads_latencies_leave_out_the_requests_a_host_stall_slowed():
    """Requests that decoded while the meter's windows were starved are left out of TTFT and TPOT, unless none
    would be left."""
    from advisor.deploy.vllm import SteadyLoad

    load = SteadyLoad(None, None, batch=4, input_tokens=16, output_tokens=8, vocab_size=64)
    # (TTFT s, TPOT s, first token at, finished at): two before the stall, two during it
    load.latencies = [(0.010, 0.005, 1.0, 2.0), (0.012, 0.005, 2.0, 3.0), (0.030, 0.009, 4.8, 5.8),
                      (0.031, 0.009, 5.5, 6.5)]
    fed = load.latency_ms([(5.0, 7.0)])
    assert fed["tpot_ms_p50"] == pytest.approx(5.0) and fed["latency_requests"] == 2
    assert fed["latency_requests_left_out"] == 2
    whole = load.latency_ms()
    assert whole["tpot_ms_p50"] == pytest.approx(7.0) and "latency_requests_left_out" not in whole
    assert load.latency_ms([(0.0, 100.0)]) == whole  # every request in the stall: all of them, not none


def test_every_request_is_greedy_so_the_engine_goes_without_flashinfer_s_sampler(tmp_path, monkeypatch):
    # the premise of VLLM_USE_FLASHINFER_SAMPLER=0: vLLM never samples a greedy request through FlashInfer
    vllm = fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "unset below")  # so that the test's end restores it
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER")
    seqs = (tuple(range(1, 21)),)
    reference = write_reference(tmp_path / "ref.pt", [torch.log_softmax(torch.zeros(19, 64), -1)])
    out = serve(ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, sequences=seqs,
                         reference_logprobs=str(reference), items=((tuple(range(1, 10)), (10, 11)),), meter=FAST,
                         workloads=({"name": "chat", "batch_size": 2, "input_tokens": 8, "output_tokens": 16},)),
                make_counter=lambda: ConstantPowerCounter(300.0))
    assert vllm.params_made and {p.temperature for p in vllm.params_made} == {0.0}
    assert vllm.instances[0].environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert out["engine_env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_every_engine_shares_triton_s_own_cache_unless_the_user_set_one(tmp_path, monkeypatch):
    # vLLM's AOT compile would otherwise leave each plan's engine a Triton cache of its own (ENGINE_ENV's comment)
    vllm = fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setenv("TRITON_CACHE_DIR", "unset below")  # so that the test's end restores it
    monkeypatch.delenv("TRITON_CACHE_DIR")
    out = serve(ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, prefill=False))
    shared = os.path.join(os.path.expanduser("~"), ".triton", "cache")
    assert vllm.instances[0].environ["TRITON_CACHE_DIR"] == shared == out["engine_env"]["TRITON_CACHE_DIR"]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    out = serve(ServeJob(str(checkpoint(tmp_path / "ck2")), vocab_size=64, formats=False, prefill=False))
    assert out["engine_env"]["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_a_user_s_own_sampler_setting_stands(tmp_path, monkeypatch):
    vllm = fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "1")
    out = serve(ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, prefill=False))
    assert vllm.instances[0].environ["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert out["engine_env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "1"


def test_a_request_s_tpot_is_over_the_tokens_it_produced(monkeypatch):
    """Each finished request's TPOT: its decode time over its own output tokens less one, whatever length the load
    states (a request of another length, or one that ended early, is not priced at the stated length)."""
    from types import SimpleNamespace

    from advisor.deploy.vllm import SteadyLoad

    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr("advisor.deploy.vllm._load.time.perf_counter", lambda: next(clock))
    load = SteadyLoad(None, None, batch=2, input_tokens=16, output_tokens=8, vocab_size=64)
    for rid, length in (("short", 4), ("long", 13)):
        load._added[rid] = next(clock)
        for i in range(length):  # a token a second; the first one after a second's wait
            load._timed(SimpleNamespace(request_id=rid, finished=i == length - 1), 1)
    assert [round(tpot, 6) for _, tpot, _, _ in load.latencies] == [1.0, 1.0]
    assert [ttft for ttft, _, _, _ in load.latencies] == [1.0, 1.0]
