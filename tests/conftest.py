from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from pg_server import postgres_server, postgres_url  # noqa: F401  (pytest fixtures: a real PostgreSQL)

# Triton reads TRITON_INTERPRET once, when it is first imported: without a GPU the
# runtime's kernels run in its CPU interpreter (tests/test_runtime_kernels.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TINY_MODEL = SHARED / "models" / "tinystories-656k"
TINY_TEXT = SHARED / "data" / "text" / "tinystories_val.txt"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"test data {path} is missing: these tests read ../shared next to the repository (see README)")
    return path


@pytest.fixture
def tiny_model_dir() -> Path:
    return need(TINY_MODEL)


def tiny_recipe_dict(out: Path, **search: object) -> dict:
    """A recipe for the trained tiny model that writes into ``out``; ``search`` overrides its search block."""
    return {
        "name": "t",
        "model": {"source": str(need(TINY_MODEL))},
        "target": "b200",
        "workloads": [{"name": "chat", "batch_size": 8, "input_tokens": 128, "output_tokens": 64}],
        "calibration": {"num_samples": 2, "seq_len": 16, "heldout_samples": 2, "heldout_seq_len": 16},
        "search": {"trials": 5, "seed": 0, **search},
        "out": str(out),
        "device": "cpu",
    }


def verify_recipe_dict(source: Path, out: Path, name: str = "tiny") -> dict:
    """A run for `advisor verify`'s tests: one workload with a TPOT objective the fake engine meets, small
    calibration, three trials, predicted energy."""
    return {
        "name": name, "model": {"source": str(source)}, "target": "h100",
        "workloads": [{"name": "chat", "batch_size": 4, "input_tokens": 16, "output_tokens": 8, "tpot_ms": 1000.0,
                       "max_concurrency": 6}],
        "calibration": {"num_samples": 4, "seq_len": 32, "heldout_samples": 2, "heldout_seq_len": 32},
        "search": {"trials": 3, "seed": 0}, "out": str(out), "device": "cpu", "energy": "predicted",
    }


@pytest.fixture
def tiny_recipe(tmp_path, tiny_model_dir):
    """A recipe dict for the trained tiny model, writing into tmp_path."""
    return tiny_recipe_dict(tmp_path / "runs")


@pytest.fixture(scope="module")
def one_torch_thread():
    """For tests on hidden-64 models: their matrices are too small to share between threads, and with
    other jobs on the cores two intra-op threads made a forward 5-40x slower than one (spin-waiting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def own_profile_store(tmp_path_factory, monkeypatch):
    """Each test predicts from an empty profile store of its own, never the profiles of the machine's user."""
    monkeypatch.setenv("ADVISOR_PROFILE_DIR", str(tmp_path_factory.mktemp("profiles")))


@pytest.fixture(autouse=True)
def hub_settings_restored(monkeypatch):
    """The CLI switches the Hugging Face libraries offline where the hub does not resolve (in-process commands
    set it in os.environ); each test starts with the settings it was given, and in-process commands do no DNS
    lookup (the answer would depend on the machine; tests/test_hub_access.py puts the real lookup back)."""
    from advisor.models import hub_access

    monkeypatch.setattr(hub_access, "_resolves", lambda host, timeout_s: None)
    for name in ("HF_HUB_OFFLINE", "ADVISOR_HUB_UNREACHABLE"):
        was = os.environ.get(name)
        monkeypatch.setenv(name, "")  # records the value to restore (or its absence) for teardown
        if was is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, was)


@pytest.fixture(autouse=True, scope="session")
def every_summary_is_readable():
    """Each summary.json any test's search or report writes is read back at once, as `show`, `report`,
    `export` and `recheck` read it: a run that finished must never leave a result those refuse."""
    from summary_readers import read_as_every_command

    import advisor.report.summary as summary_module

    write = summary_module.write_text_atomically

    def write_then_read(path: Path, text: str) -> None:
        write(path, text)
        if path.name == "summary.json":
            read_as_every_command(path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(summary_module, "write_text_atomically", write_then_read)
        yield
