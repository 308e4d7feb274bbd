"""Measure the energy profile of this GPU (Llama-3.1-8B shape) and save it as JSON.

    python benchmarks/energy_profile.py --out advisor/profiles/h200_<date>.json

Same as `advisor profile`; several minutes (about 12 meter measurements of ~18 s).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from advisor.energy.profiling import measure_profile, save_profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    prof = measure_profile(command, log=lambda *a: print(*a, flush=True))
    print("saved", save_profile(prof, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
