"""Assemble a shipped GPU profile: measured GEMM tables, anchor models' per-model profiles, and the fit.

    python benchmarks/build_gpu_profile.py --tables TABLES.json --anchors RAW.json [--anchors RAW2.json] \
        --out advisor/energy/profiles/h100_gemm_<date>.json

``--tables`` is ``advisor profile`` (or ``energy_transfer_collect.py --tables``) output; each
``--anchors`` file's ``anchors`` (collect ``--anchors``) replace those of the same name before it;
``--caveat`` is shown in every label the profile prices. ``--gemm-energy`` (a ``gemm_energy_collect.py``
output) with ``--gemm-energy-anchors`` (collect ``--anchors`` output from the same GPU unit), repeated per
unit, adds the metered GEMM energies (their mean over the units) and their fitted rest
(:mod:`advisor.energy.profiling`), which price models of large layers; ``--small-layers`` says how it prices
smaller ones (``mean``, the default: the mean of that form and the fitted one; ``fitted``: the fitted one).
The fit (:func:`advisor.energy.prediction.fit_gpu_profile`) is stored so predicting needs no solver.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.energy.prediction import fit_gpu_profile  # noqa: E402
from advisor.energy.profiling import SMALL_LAYER_RULES, gemm_energy_section  # noqa: E402
from advisor.errors import InputError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=Path, required=True)
    ap.add_argument("--anchors", type=Path, action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--caveat", default="", help="a known limit of this profile, added to every label it prices "
                    "(its measured transfer error, say)")
    ap.add_argument("--gemm-energy", type=Path, action="append", default=[],
                    help="benchmarks/gemm_energy_collect.py output (repeat for several units)")
    ap.add_argument("--gemm-energy-anchors", type=Path, action="append", default=[],
                    help="energy_transfer_collect.py --anchors output metered on the same unit as the "
                    "--gemm-energy of the same position")
    ap.add_argument("--small-layers", choices=SMALL_LAYER_RULES, default="mean",
                    help="with --gemm-energy: how models of layers below its threshold are priced")
    args = ap.parse_args(argv)
    if len(args.gemm_energy) != len(args.gemm_energy_anchors):
        ap.error("give one --gemm-energy-anchors per --gemm-energy, in the same order")
    profile = json.loads(args.tables.read_text())
    for path in args.anchors:
        profile["anchors"].update(json.loads(path.read_text()).get("anchors", {}))
    profile["fit"] = fit_gpu_profile(profile)
    if args.gemm_energy:
        units = [(json.loads(e.read_text()), json.loads(a.read_text()))
                 for e, a in zip(args.gemm_energy, args.gemm_energy_anchors, strict=True)]
        try:
            profile["gemm_energy"] = gemm_energy_section(profile, units, args.small_layers)
        except InputError as e:
            ap.error(str(e))
    if args.caveat:
        profile["caveat"] = args.caveat
    profile["assembled_by"] = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    args.out.write_text(json.dumps(profile, separators=(",", ":")))  # shipped in the wheel: compact
    print(json.dumps(profile["fit"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
