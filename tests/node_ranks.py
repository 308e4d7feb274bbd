"""What the node tests run in each of their processes (spawned by torch.multiprocessing, so importable by name):
the stages of a search prepared on one rank of a real gloo group on 127.0.0.1, their results saved for the test
to compare with one process's."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

import torch

from advisor.formats import Format
from advisor.plan import Plan


def join(rank: int, world: int, port: int) -> Any:
    import torch.distributed as dist

    from advisor.models.replicas import Ranks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    return Ranks(rank, world)


def stage_results(ctx: Any) -> dict[str, Any]:
    """What each shared stage produced: tokens, every bank module's state per format and the packing's
    statistics, the reference log-probs, the sensitivity tables and a mixed plan's score."""
    groups = ctx.loaded.shape.groups
    bank = {fmt.value: {m: {k: v.detach().clone() for k, v in module.state_dict().items()}
                        for m, module in ctx.bank._modules[fmt].items()}
            for fmt in ctx.bank.formats if fmt != Format.BF16}
    mixed = Plan({g.name: (Format.FP8, Format.NVFP4, Format.BF16)[i % 3] for i, g in enumerate(groups)})
    sens = ctx.sensitivity()
    return {
        "tokens": (ctx.tokens.calibration, ctx.tokens.heldout),
        "bank": bank,
        "pack_stats": (ctx.bank.pack_stats.packed, ctx.bank.pack_stats.patched, ctx.bank.pack_stats.kept_bf16),
        "reference": list(ctx.proxy._ref_logprobs),
        "sensitivity": sens.to_json() | {"time_s": None},
        "mixed": ctx.proxy.score(ctx.bank.assemble(mixed)),
    }


def prepare_here(recipe_data: dict, ranks: Any = None) -> dict[str, Any]:
    from advisor.recipe import validate_recipe
    from advisor.workflows.context import prepare

    recipe = validate_recipe(recipe_data, "test recipe")
    ctx = prepare(recipe, ranks=ranks)
    return stage_results(ctx) | {"busy": dict(ranks.busy_s) if ranks else {}}


def ranges_without_data_on_one_rank(recipe_data: dict, ranks: Any) -> dict[str, torch.Tensor]:
    """FP8 ranges calibrated on the first calibration batch by rank 0 alone: rank 1 runs no forward at all."""
    from advisor.calibration.tokens import TokenSets, forward_loop
    from advisor.models.loading import load_model
    from advisor.quantize.modelopt_config import quantize_plan
    from advisor.recipe import validate_recipe

    recipe = validate_recipe(recipe_data, "test recipe")
    loaded = load_model(recipe.model, "cpu")
    tokens = TokenSets.load(recipe.run_dir / "tokens.pt")
    batches = [0] if ranks is None or ranks.rank == 0 else []
    model = quantize_plan(loaded.model, Plan.uniform(loaded.shape.groups, Format.FP8), loaded.shape.groups,
                          forward_loop(tokens.calibration, batches=batches), ranks)
    return {n: b.clone() for n, b in model.named_buffers() if n.endswith("_amax")}


def run_rank(rank: int, world: int, port: int, recipe_data: dict, out: str) -> None:
    ranks = join(rank, world, port)
    data = {**recipe_data, "out": str(Path(out) / f"rank{rank}")}
    results = prepare_here(data, ranks)
    if rank == 0:  # the other ranks have no token file of their own: they received rank 0's sets
        results["ranges"] = ranges_without_data_on_one_rank(data, ranks)
    else:
        ranges_without_data_on_one_rank({**data, "out": str(Path(out) / "rank0")}, ranks)
    torch.save(results, Path(out) / f"rank{rank}.pt")


def run_rank_that_fails(rank: int, world: int, port: int, recipe_data: dict, out: str) -> None:
    """Rank 1 fails in the bank stage, after it has packed its first module (a real error of its own, then the
    process ends, as `advisor worker` does); rank 0 saves what it saw and how long it waited."""
    from advisor.errors import InputError
    from advisor.models.replicas import RankLost
    from advisor.quantize import bank_ranks

    ranks = join(rank, world, port)
    if rank == 1:
        real = bank_ranks.pack_folded
        calls = []

        def failing(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) > 1:
                raise InputError("rank 1 cannot go on")
            return real(*args, **kwargs)

        bank_ranks.pack_folded = failing
    t = time.monotonic()
    try:
        prepare_here({**recipe_data, "out": str(Path(out) / f"rank{rank}")}, ranks)
        outcome: Any = "finished"
    except RankLost as exc:
        outcome = ("lost", exc.stage, str(exc))
    except InputError as exc:
        outcome = ("own", str(exc))
    if rank == 1:
        os._exit(2)
    torch.save({"outcome": outcome, "waited_s": time.monotonic() - t}, Path(out) / f"rank{rank}.pt")
