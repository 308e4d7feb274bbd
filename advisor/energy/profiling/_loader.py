"""The one loader of every kind of profile: a user's file of any schema, and the shipped layer and GPU profiles
(per-model profiles ship laid out as a store: :func:`~advisor.energy.profiling.shipped_model_profiles`)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from advisor.energy.profiling._gpu_profile import SCHEMA as GPU_SCHEMA
from advisor.energy.profiling._gpu_profile import validate_gpu_profile
from advisor.energy.profiling._layer import validate_profile
from advisor.energy.profiling._model import is_model_profile, validate_model_profile
from advisor.errors import InputError
from advisor.files import check_regular_file
from advisor.formats import GPU


def shipped_gpu_profile(gpu: GPU) -> dict[str, Any] | None:
    """The newest shipped GPU profile (GEMM tables, ``<gpu>_gemm_<date>.json``) for ``gpu``, or None."""
    folder = resources.files("advisor.energy") / "profiles"
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.startswith(f"{gpu.value}_gemm_"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return json.loads((folder / names[-1]).read_text()) if names else None


def _read_json_profile(path: Path) -> dict[str, Any]:
    check_regular_file(path, "profile", "give a profile JSON written by `advisor profile`")
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read profile {path}: {exc.strerror}; give a profile JSON written by "
                         "`advisor profile` (or leave energy_profile unset)") from None
    except ValueError as exc:
        raise InputError(f"profile {path} is not JSON ({exc}); give a profile JSON written by "
                         "`advisor profile`") from None


def read_any_profile(path: Path) -> dict[str, Any]:
    """A per-model, GPU or layer profile JSON, checked against its schema (InputError naming the file)."""
    data = _read_json_profile(path)
    if is_model_profile(data):
        return validate_model_profile(data, f"profile {path}")
    if data.get("schema") == GPU_SCHEMA:
        return validate_gpu_profile(data, f"profile {path}")
    return validate_profile(data, f"profile {path}")


def load_profile(path: Path | str) -> dict[str, Any]:
    """A layer profile JSON, checked against its schema (InputError naming the file)."""
    return validate_profile(_read_json_profile(Path(path)), f"profile {path}")


def shipped_profile(gpu: GPU) -> dict[str, Any] | None:
    """The newest layer profile shipped for ``gpu`` (``profiles/<gpu>_<date>.json``), or None."""
    folder = resources.files("advisor.energy") / "profiles"
    try:
        names = sorted(
            p.name for p in folder.iterdir()
            if p.name.startswith(f"{gpu.value}_") and p.name.endswith(".json") and "_gemm_" not in p.name
        )  # <gpu>_gemm_<date>.json are GPU profiles, not layer profiles
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not names:
        return None
    return validate_profile(json.loads((folder / names[-1]).read_text()), f"shipped profile {names[-1]}")
