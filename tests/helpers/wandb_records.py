"""What an offline W&B run wrote, read back from its ``run-<id>.wandb`` file.

wandb 0.31 no longer ships a Python reader of its transaction log (the DataStore of
wandb.sdk.internal went with the move to wandb-core), so this reads the format itself: a
7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB's log format (32 KiB blocks;
each record a 7-byte header: CRC-32, little-endian length, type FULL/FIRST/MIDDLE/LAST), each
full record one serialized ``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Every record of the ``.wandb`` file at ``path``, in order."""
    data = path.read_bytes()
    assert data[: len(HEADER)] == HEADER, f"{path}: not a W&B transaction log"
    out, pending, offset = [], b"", len(HEADER)
    while offset + 7 <= len(data):
        if BLOCK - offset % BLOCK < 7:  # the block's tail is padding
            offset += BLOCK - offset % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            offset += BLOCK - offset % BLOCK
            continue
        if offset + 7 + length > len(data):  # a record still being written
            break
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def _items(items: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@dataclass
class OfflineRun:
    """An offline run's id, config, history (merged by step) and summary."""

    run_id: str
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, Any]] = field(default_factory=lambda: defaultdict(dict))
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def read_offline_run(path: Path, timeout: float = 30) -> OfflineRun:
    """The run the ``.wandb`` file at ``path`` holds, once its exit record is written
    (``run.finish`` returns before wandb-core's writer has flushed the file)."""
    deadline = time.monotonic() + timeout
    while True:
        run = _read(path)
        if run.exit_code is not None or time.monotonic() > deadline:
            return run
        time.sleep(0.1)


def _read(path: Path) -> OfflineRun:
    run = OfflineRun(run_id="")
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            values = _items(record.history.item)
            step = record.history.step.num if record.history.HasField("step") else values["_step"]
            run.history[int(step)].update(values)
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path) -> list[Path]:
    """The ``.wandb`` files of the offline runs under ``wandb_dir``, oldest first."""
    return sorted(wandb_dir.glob("**/offline-run-*/run-*.wandb"))
