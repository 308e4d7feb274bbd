"""`advisor search --dry-run`: the memory plan as a table (rich on a terminal, plain text in a pipe) or JSON."""

from __future__ import annotations

import json

from rich.table import Table

from advisor.cli.common import out
from advisor.models.memory_plan import GIB, RESERVED_PER_DEVICE, MemoryPlan, compact


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def print_plan(plan: MemoryPlan, as_json: bool = False) -> None:
    if as_json:
        out.print_json(json.dumps(plan.to_dict()))
        return
    sizes = plan.sizes
    out.print(f"memory plan of {plan.model} (formats {', '.join(sizes.formats)}; calibration "
              f"{sizes.calibration_samples}x{sizes.calibration_seq}, held-out {sizes.heldout_samples}x"
              f"{sizes.heldout_seq} tokens{', lm-eval' if sizes.lm_eval else ''}), GiB", highlight=False, markup=False)
    plain = {} if out.is_terminal else {"box": None}  # no box drawing in a pipe or a file
    totals = Table("part", "GiB", title="whole model", **plain)
    for name, n in plan.totals.items():
        totals.add_row(name, _gib(n))
    for name, n in plan.cpu_bytes.items():
        totals.add_row(f"CPU: {name}", _gib(n))
    out.print(totals)
    devices = Table("device", "memory", "holds", "weights", "bank", "records", "workspace", "logits", "streaming",
                    "reserved", "used", title="per device", **plain)
    for p in plan.placements:
        devices.add_row(p.device.name, _gib(p.device.memory_bytes), ", ".join(compact(p.items)) or "-",
                        _gib(p.weights_bytes), _gib(p.bank_bytes), _gib(p.records_bytes), _gib(p.workspace_bytes),
                        _gib(p.logits_bytes), _gib(p.stream_buffer_bytes), _gib(RESERVED_PER_DEVICE),
                        _gib(p.used_bytes))
    if plan.overflow:
        devices.add_row("streams from CPU" if plan.streaming else "would not fit", "-",
                        ", ".join(compact(plan.overflow)), "", "", "", "", "", "", "", _gib(plan.overflow_bytes))
    out.print(devices)
    if plan.fits:
        verdict = "fits"
    elif plan.streaming:
        verdict = (f"does not fit the GPUs: runs with {', '.join(compact(plan.overflow))} streamed from CPU memory "
                   f"({sum(plan.cpu_bytes.values()) / GIB:.1f} GiB of it; slower, the same numbers)")
    else:
        verdict = "does not fit"
    fewest = f"; the fewest such GPUs that hold it: {plan.smallest_gpus}" if plan.smallest_gpus else ""
    out.print(f"{verdict}{fewest}", highlight=False, markup=False)
