"""Where per-model profiles are kept: the user's store and the profiles shipped with the package.

Laid out as ``<root>/<gpu kind>/<model digest>/<key digest>.json``. A search on a GPU reuses a profile
of exactly its key (:meth:`ProfileStore.find`); predicting without that GPU takes the newest of the
model, else of a model of the same layer geometry, for the GPU kind (:meth:`ProfileStore.find_for_kind`).
GPU profiles the user measured (`advisor profile` without ``--model``) are kept beside them, in
``<root>/gpu/<gpu kind>_gemm_<date>.json``, and priced before the shipped one (:meth:`ProfileStore.gpu_profile`).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from advisor.energy.profiling._model import (
    RUNTIME_VERSION,
    geometry_digest,
    key_digest,
    validate_model_profile,
)
from advisor.errors import InputError


def shipped_model_profiles() -> Path:
    """Per-model profiles shipped with the package (``advisor/energy/profiles/models``), laid out as a store."""
    return Path(str(resources.files("advisor.energy") / "profiles" / "models"))


class ProfileStore:
    """Per-model profiles on disk: ``<root>/<gpu kind>/<model digest>/<key digest>.json``.

    ``root`` defaults to ``$ADVISOR_PROFILE_DIR`` or ``~/.cache/precision-advisor/profiles``. For
    predicting without the GPU, :meth:`find_for_kind` also reads ``shipped`` (default: the profiles
    shipped with the package, e.g. Qwen3-30B-A3B on an H200), after the user's own.
    """

    def __init__(self, root: Path | str | None = None, shipped: Path | None = None) -> None:
        default = os.environ.get("ADVISOR_PROFILE_DIR") or Path.home() / ".cache" / "precision-advisor" / "profiles"
        self.root = Path(root or default)
        self.shipped = shipped if shipped is not None else shipped_model_profiles()

    def path_for(self, profile: dict[str, Any]) -> Path:
        key = profile["key"]
        return self.root / str(profile["gpu_kind"]) / key["model"] / f"{key_digest(key)}.json"

    def save(self, profile: dict[str, Any]) -> Path:
        return _write_whole(self.path_for(profile), profile)

    def _candidates(self, gpu_kind: str, model: str, root: Path | None = None) -> list[dict[str, Any]]:
        folder = (root or self.root) / gpu_kind / model
        out = []
        for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                out.append(validate_model_profile(json.loads(p.read_text()), str(p)))
            except (ValueError, InputError):
                continue  # a damaged or foreign file is not a profile
        return out

    def find(self, key: dict[str, Any], gpu_kind: str) -> dict[str, Any] | None:
        """The profile of exactly this key (same GPU unit, driver, power limit, model, runtime)."""
        for p in self._candidates(gpu_kind, key["model"]):
            if p["key"] == key:
                return p
        return None

    def _same_geometry(self, gpu_kind: str, geometry: str, root: Path) -> list[dict[str, Any]]:
        folder = root / gpu_kind
        models = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        return [p for m in models for p in self._candidates(gpu_kind, m, root)
                if geometry_digest(p["model"]) == geometry]

    def find_for_kind(self, gpu_kind: str, model: str, runtime: str = RUNTIME_VERSION,
                      geometry: str | None = None) -> dict[str, Any] | None:
        """The newest profile of this model on any GPU of ``gpu_kind`` with this runtime (for predicting
        without that GPU here): the user's own, else one shipped with the package (marked ``shipped``). With
        ``geometry`` (:func:`geometry_digest`), a profile of another model with the same geometry is taken
        where none of this model is, in the same order (marked ``same_geometry``)."""
        for root, shipped in ((self.root, False), (self.shipped, True)):
            lookups = [(self._candidates(gpu_kind, model, root), False)]
            if geometry is not None:
                lookups.append((self._same_geometry(gpu_kind, geometry, root), True))
            for candidates, by_geometry in lookups:
                found = [p for p in candidates if p["key"]["runtime"] == runtime]
                if found:
                    best = max(found, key=lambda p: p.get("measured_at", 0.0))
                    marks = {"shipped": True} if shipped else {}
                    return {**best, **marks, "same_geometry": True} if by_geometry else {**best, **marks}
        return None

    def gpu_profile_path(self, profile: dict[str, Any]) -> Path:
        unit = str(profile.get("gpu_uuid") or "")[-12:]
        return self.root / "gpu" / f"{profile['gpu_kind']}_gemm_{profile['date']}{'_' + unit if unit else ''}.json"

    def save_gpu_profile(self, profile: dict[str, Any]) -> Path:
        return _write_whole(self.gpu_profile_path(profile), profile)

    def gpu_profile(self, gpu_kind: str) -> dict[str, Any] | None:
        """The newest GPU profile the user measured on a GPU of ``gpu_kind`` (marked ``stored`` with its path),
        or None; damaged or foreign files are passed over."""
        from advisor.energy.profiling._gpu_profile import validate_gpu_profile

        folder = self.root / "gpu"
        found = []
        for p in sorted(folder.glob(f"{gpu_kind}_gemm_*.json")) if folder.is_dir() else []:
            try:
                data = validate_gpu_profile(json.loads(p.read_text()), str(p))
            except (ValueError, InputError):
                continue
            if data.get("gpu_kind") == gpu_kind:
                found.append((str(data["date"]), p.name, {**data, "stored": str(p)}))
        return max(found, key=lambda f: f[:2])[2] if found else None


def _write_whole(path: Path, profile: dict[str, Any]) -> Path:
    """Write through a temporary file, so a reader never sees half a profile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=1))
    tmp.replace(path)
    return path
