"""Versions of the packages whose behaviour changes the numbers (stored with every study)."""

from __future__ import annotations

from importlib import metadata

PACKAGES = ("torch", "transformers", "nvidia-modelopt", "optuna", "lm_eval", "nvidia-ml-py")


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out
