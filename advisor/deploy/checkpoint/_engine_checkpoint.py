"""Each measured plan exported once for an engine to serve (``RUN_DIR/engine_checkpoints/<plan id>``)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.plan import Plan


def checkpoint_exporter(recipe: Any, loaded: Any, tokens: Any, smoke: bool = False) -> Callable[[Plan], Path]:
    """``plan -> folder``: the plan exported once (``advisor export``'s code) into
    ``RUN_DIR/engine_checkpoints/<plan id>``, reused when its export finished before."""
    from advisor.deploy.checkpoint._export import export_plan

    folder = Path(recipe.run_dir) / "engine_checkpoints"
    workloads = [w.model_dump() for w in recipe.workloads]

    def checkpoint_for(plan: Plan) -> Path:
        out = folder / plan.id
        if not (out / "export.json").is_file():
            if out.exists():  # what an interrupted export of this run left
                shutil.rmtree(out)
            export_plan(loaded, plan, tokens, out, workloads, target=recipe.target.value, smoke=smoke)
        return out

    return checkpoint_for
