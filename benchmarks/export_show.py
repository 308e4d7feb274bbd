"""Show for issue 6: export a plan on the tiny model and on SmolLM2-135M, list the files,
print the quant config and the round-trip numbers. CPU only.

    cd <repo> && python benchmarks/export_show.py [tiny|smollm2|all]

Checkpoints go to /tmp/advisor-export-show/ (not committed); the small files (config,
hf_quant_config.json, llm_api_options.yaml, README.md, export.json, file list) are
copied into reports/export/<name>/.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "reports" / "export"
TMP = Path("/tmp/advisor-export-show")
KEEP = ("config.json", "hf_quant_config.json", "llm_api_options.yaml", "README.md", "export.json")


def keep(ckpt: Path, name: str, header: str) -> None:
    dst = HERE / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in KEEP:
        if (ckpt / f).is_file():
            shutil.copy(ckpt / f, dst / f)
    listing = [f"{p.stat().st_size:>12,d}  {p.name}" for p in sorted(ckpt.iterdir())]
    (dst / "files.txt").write_text(header + "\n\n" + "\n".join(listing) + "\n")
    print(header)
    print("\n".join(listing))
    print((ckpt / "hf_quant_config.json").read_text() if (ckpt / "hf_quant_config.json").is_file() else "(BF16)")
    rt = json.loads((ckpt / "export.json").read_text())["roundtrip"]
    print(json.dumps({k: v for k, v in rt.items() if k != "method"}, indent=1))


def tiny() -> None:
    """The full user path: advisor search on the tiny recipe, then the export command."""
    runs, ckpt = TMP / "runs", TMP / "tiny-ckpt"
    shutil.rmtree(TMP / "runs", ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    advisor = str(Path(sys.executable).with_name("advisor"))
    t = time.perf_counter()
    subprocess.run([advisor, "search", "-r", "recipes/tiny.yaml", "--out", str(runs)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    # `advisor export` once the lead wires it; the same function through a one-command app here:
    subprocess.run([sys.executable, "-c",
                    "import typer; from advisor.cli.deploy import export; a = typer.Typer(); "
                    "a.command()(export); a.command('x')(lambda: None); a()",
                    "export", str(runs / "tiny"), "--out", str(ckpt)], cwd=REPO, check=True)
    keep(ckpt, "tiny", f"tiny model: advisor search -r recipes/tiny.yaml; advisor export {runs / 'tiny'} "
                       f"--out {ckpt} ({time.perf_counter() - t:.0f} s incl. search)")


def smollm2() -> None:
    """SmolLM2-135M (demo GGUF): a mixed FP8/NVFP4/BF16 plan of the quickstart's kind, exported directly
    (no quickstart search was run here: it takes longer than this CPU budget allows)."""
    import warnings

    warnings.simplefilter("ignore")
    from advisor.calibration.tokens import build_token_sets
    from advisor.deploy.checkpoint import export_plan
    from advisor.formats import Format
    from advisor.models.loading import load_model
    from advisor.plan import Plan
    from advisor.recipe.schema import CalibrationSpec, ModelSpec, load_recipe

    t = time.perf_counter()
    loaded = load_model(ModelSpec(), "cpu")
    groups = loaded.shape.groups

    def fmt(name: str) -> Format:
        idx, role = int(name.split(".")[1]), name.split(".")[2]
        if idx in (0, 29):
            return Format.BF16  # first and last layers: the usual sensitive ones
        if role == "gate_up" and 10 <= idx < 20:
            return Format.NVFP4
        return Format.FP8

    plan = Plan({g.name: fmt(g.name) for g in groups})
    spec = CalibrationSpec(num_samples=4, seq_len=64, heldout_samples=4, heldout_seq_len=64)
    tokens = build_token_sets(loaded.model, loaded.tokenizer, spec)
    workloads = [w.model_dump() for w in load_recipe(REPO / "recipes" / "quickstart.yaml").workloads]
    ckpt = TMP / "smollm2-ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    export_plan(loaded, plan, tokens, ckpt, workloads, target="b200")
    keep(ckpt, "smollm2", f"SmolLM2-135M-Instruct (demo:smollm2-135m), plan {plan.id} ({plan.label()}), "
                          f"calibration 4x64 / held-out 4x64 self-sampled tokens, CPU "
                          f"({time.perf_counter() - t:.0f} s incl. model load)")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("tiny", "all"):
        tiny()
    if which in ("smollm2", "all"):
        smollm2()
