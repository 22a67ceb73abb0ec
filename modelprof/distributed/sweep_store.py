"""A sweep's results on disk: one JSON file per finished configuration, written atomically (a
killed sweep leaves only whole result files, which a rerun skips, and at most a hidden temporary
file per killed writer, which the next finished sweep removes), and the combined table."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from modelprof.distributed.sweep_config import SweepConfig
from modelprof.errors import ModelProfError
from modelprof.runtime.env import jsonable

__all__ = ["ResultStore", "make_folder", "write_atomic"]

#: the layout and meaning of a result file; a file of another is run again, not mixed in.
#: 2: a median's 95 % interval is cut to the samples' range only from six blocks on
_FORMAT = 2


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_folder(folder: Path, label: str) -> list[Path]:
    """Create ``folder``; refuse, naming ``label``, one under a file or not writable. The
    directories it created, deepest first (for a caller that removes them if left empty)."""
    chain = (folder, *folder.parents)
    missing = list(itertools.takewhile(lambda p: not p.exists(), chain))
    existing = chain[len(missing)] if len(missing) < len(chain) else None
    if existing is not None and not existing.is_dir():
        raise ModelProfError(f"{label}: {str(existing)!r} is a file, not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelProfError(f"{label}: cannot create the directory ({e.strerror or e})") from e
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ModelProfError(f"{label}: the directory is not writable")
    return missing


class ResultStore:
    """``out/configs/<config name>.json`` per configuration; ``out/sweep.{csv,json}``."""

    def __init__(
        self,
        out: str | os.PathLike[str],
        csv_text: Callable[[pd.DataFrame], str],
        json_text: Callable[..., str],
    ) -> None:
        """``csv_text``, ``json_text``: the exporters' CSV and JSON writers
        (``render.csvio.to_csv``, ``render.jsonio.to_json``: ``read_json`` gives the frame
        back exactly, the environment in ``frame.attrs["env"]`` with it)."""
        self.out = Path(out)
        self.csv_text, self.json_text = csv_text, json_text
        self.folder = self.out / "configs"
        make_folder(self.folder, f"out={str(self.out)!r}")

    def check(self, configs: Iterable[SweepConfig]) -> None:
        """Refuse, before anything runs, a result path held by something other than a file."""
        for config in configs:
            path = self.path(config)
            if path.exists() and not path.is_file():
                raise ModelProfError(
                    f"out={str(self.out)!r}: {str(path)!r}, where the result "
                    "of a configuration goes, is not a file: move it away"
                )

    def path(self, config: SweepConfig) -> Path:
        return self.folder / f"{config.name}.json"

    def load(self, config: SweepConfig) -> dict[str, Any] | None:
        """The row a finished run of ``config`` wrote, or None (never run, or another layout)."""
        try:
            data = json.loads(self.path(config).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("row"), dict):
            return None  # (valid JSON of another shape: run again, as for a broken file)
        if data.get("format") != _FORMAT or data.get("config") != config.to_dict():
            return None
        return dict(data["row"])

    def save(self, config: SweepConfig, row: Mapping[str, Any]) -> None:
        data = {"format": _FORMAT, "config": config.to_dict(), "row": jsonable(row)}
        _write(self.path(config), json.dumps(data, indent=1, allow_nan=False))

    def write_table(self, frame: pd.DataFrame) -> None:
        """``sweep.csv`` and ``sweep.json``, each atomically; called once every rank is done, so
        a ``.<name>.tmp`` left in ``configs/`` is a killed writer's (a SIGKILL between the
        temporary file and its rename skips ``write_atomic``'s clean-up): removed."""
        for stray in self.folder.glob(".*.json.*.tmp"):
            with contextlib.suppress(OSError):
                stray.unlink()
        _write(self.out / "sweep.csv", self.csv_text(frame))
        _write(self.out / "sweep.json", self.json_text(frame, env=frame.attrs.get("env")))


def _write(path: Path, text: str) -> None:
    """``write_atomic``, a file that cannot be written said in one line."""
    try:
        write_atomic(path, text)
    except OSError as e:
        raise ModelProfError(f"cannot write {str(path)!r}: {e.strerror or e}") from e
