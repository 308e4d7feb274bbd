"""Artifacts every worker of a study must share, through Optuna's artifact store.

The coordinator builds the calibration and held-out token sets once and uploads them;
workers download the same file, so every trial of the study, on any host, is scored on
the same tokens (self-sampled tokens differ between devices and library versions). The
store is Optuna's ``FileSystemArtifactStore`` on a folder every host can read (the run
folder by default; any shared mount for several hosts).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact

from advisor.errors import SetupError

TOKENS_ATTR = "artifact:tokens"
STORE_ATTR = "artifact_store"


def artifact_store(path: Path | str) -> FileSystemArtifactStore:
    Path(path).mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(path))


def share_tokens(study: optuna.Study, tokens_file: Path, key: dict[str, Any], store_dir: Path) -> str:
    """Upload the token sets; publish their artifact id and cache key with the study."""
    artifact_id = upload_artifact(artifact_store=artifact_store(store_dir), file_path=str(tokens_file),
                                  study_or_trial=study)
    # Published after the upload: upload_artifact records the artifact before the file is written.
    study.set_user_attr(STORE_ATTR, str(Path(store_dir).resolve()))
    study.set_user_attr(TOKENS_ATTR, {"artifact_id": artifact_id, "key": key})
    return artifact_id


def fetch_tokens(study: optuna.Study, dest: Path, store_dir: Path | None = None, timeout_s: float = 1800.0,
                 poll_s: float = 1.0) -> dict[str, Any]:
    """Wait for the coordinator's token sets, download them to ``dest``; returns their cache key."""
    deadline = time.monotonic() + timeout_s
    while (meta := study.user_attrs.get(TOKENS_ATTR)) is None:
        if time.monotonic() > deadline:
            raise SetupError(f"study {study.study_name!r}: no token sets were published within {timeout_s:.0f} s; "
                             "is its `advisor search` (the coordinator) running?")
        time.sleep(poll_s)
    folder = Path(store_dir or study.user_attrs[STORE_ATTR])
    if not folder.is_dir():
        raise SetupError(f"artifact store {folder} is not readable here; mount it or pass --artifacts DIR")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        dest.unlink()
    download_artifact(artifact_store=artifact_store(folder), file_path=str(dest), artifact_id=meta["artifact_id"])
    return meta["key"]
