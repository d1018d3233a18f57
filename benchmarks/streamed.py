"""Streamed plasticity against the whole model: peak memory and time of one measurement.

    python -m benchmarks.streamed [--size-gb 1.5] [--pairs 8] [--sequence-length 16]
        [--batch-size 4] [--dtype float32] [--device cpu] [--threads N] [--repeats N]
        [--memory-limit-gb G] [--malloc-mmap-threshold BYTES] [--json OUT] [--folder DIR]
        [--tiny]

A random-init ``LlamaForCausalLM`` of TinyLlama-1.1B's shape (hidden 2048, MLP 5632, 32
query and 4 key/value heads, 32000 token ids, untied LM head), with as many layers as make a
bf16 safetensors checkpoint of about ``--size-gb`` GB (``--tiny``: a model of a few hundred
kB), is saved once in ``--folder`` (``save_pretrained``; reused when there). The embedding
protocol's plasticity of ``--pairs`` pairs of seeded random token sequences is then measured
both ways, each in a fresh process so that one's peak is not the other's (``--repeats``
times, interleaved; medians):

- whole: ``build_model(entry).eval().to(device, dtype)`` then ``measure_protocols``;
- streamed: ``open_streamed(ModelSpec.from_config(entry)).to(device, dtype)`` then
  ``measure_protocols`` of the ``StreamedModel`` (one block in memory at a time, read from the checkpoint).

Each process records its peak resident set size (VmHWM of /proc/self/status, and
``getrusage``'s ru_maxrss), its RSS once torch, transformers and the package are imported,
the seconds (wall and CPU) of the measurement alone and of build + measurement (the streamed
measurement includes reading the blocks, which the whole model does in its build), and on
CUDA ``torch.cuda.max_memory_allocated``; it writes its pair table to a parquet file, which
the parent compares (exact equality, and the largest relative difference).

With ``--memory-limit-gb`` both processes run once more inside a cgroup v1 memory controller
of that limit (``/sys/fs/cgroup/memory/vp_stream``, as root), removed after; where it cannot
be created the output says so and that part is skipped. A cgroup is charged the pages first
touched from inside it: shared libraries and checkpoint pages already cached by an earlier
process are not, so its peak is below the process's RSS.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
"""TinyLlama-1.1B's shape; the number of layers follows from ``--size-gb``."""

TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "tie_word_embeddings": False,
    "num_hidden_layers": 2,
}
"""``--tiny``: a model of a few hundred kB, for the test."""

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
MIB = 2**20
SIDES = ("whole", "streamed")


def llama_config(size_gb: float, sequence_length: int, tiny: bool = False) -> dict[str, Any]:
    """The LlamaConfig arguments of a model whose bf16 checkpoint takes about ``size_gb`` GB
    (1e9 bytes), at least 1 layer, positions for ``sequence_length`` tokens."""
    shape = dict(TINY_SHAPE if tiny else SHAPE)
    if not tiny:
        h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
        kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
        layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)  # bf16 bytes of one layer
        outside = 2 * (2 * v * h + h)  # embedding, LM head, final norm
        shape["num_hidden_layers"] = max(1, round((size_gb * 1e9 - outside) / layer))
    return {**shape, "max_position_embeddings": max(sequence_length, 32)}


def checkpoint(folder: Path, config: dict[str, Any]) -> Path:
    """The folder of the model of ``config``, saved in bf16 safetensors under ``folder``
    (built in its own process when not there yet)."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]
    path = folder / f"llama-{config['hidden_size']}x{config['num_hidden_layers']}-{digest}"
    if not (path / "config.json").is_file():
        run_child(["--child", "build", "--config", json.dumps(config), "--out", str(path)])
    return path


def build_checkpoint(config: dict[str, Any], out: Path) -> None:
    """Save a seeded random-init LlamaForCausalLM of ``config`` in bf16 to ``out``: built in
    bf16 (half the memory of float32), written to a temporary folder renamed at the end."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = LlamaForCausalLM(LlamaConfig(**config, dtype="bfloat16"))
    finally:
        torch.set_default_dtype(previous)
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial, safe_serialization=True)
    partial.rename(out)


def _peak_rss_bytes() -> int:
    """VmHWM of /proc/self/status: the process's peak resident set size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_child(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side's measurement in this process: its figures, its table written to
    ``args.out``."""
    import polars as pl  # noqa: F401  (imported before the baseline, as the stages do)
    import torch
    from transformers import LlamaForCausalLM  # noqa: F401  (its imports: ~220 MiB of RSS)

    from vitplasticity.models.build import build_model
    from vitplasticity.models.checkpoint_tensors import checkpoint_bytes, checkpoint_files
    from vitplasticity.models.spec import ModelSpec
    from vitplasticity.models.streamed import open_streamed
    from vitplasticity.plasticity.measure import measure_protocols

    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    imported = _rss_bytes()
    entry = {"family": "transformers", "hf_id": "bench/llama", "weights": args.weights}
    vocab = json.loads((Path(args.weights) / "config.json").read_text())["vocab_size"]
    shape = (args.pairs, args.sequence_length)
    reference = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))
    downstream = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(2))
    counts = {"protocols": ("embedding",), "batch_size": args.batch_size, "n_pairs": args.pairs}
    sizes: dict[str, int] = {}
    loading = [0.0]  # streamed: seconds reading, casting and checking tensors

    start, start_cpu = time.perf_counter(), time.process_time()
    if side == "whole":
        model = build_model(entry).eval().to(device=device, dtype=dtype)
        measure: Callable[[], Any] = lambda: measure_protocols(  # noqa: E731
            model, reference, downstream, **counts
        )
    else:
        spec = ModelSpec.from_config(entry)
        streamed = open_streamed(spec).to(device, dtype)
        streamed._load = _timed(streamed._load, loading)  # type: ignore[method-assign]
        size = torch.empty((), dtype=dtype).element_size()
        in_blocks = sum(p.numel() for b in streamed.blocks for p in b.parameters()) * size
        parameters = checkpoint_bytes(checkpoint_files(spec), dtype)
        hidden = streamed.model.config.hidden_size
        sizes = {
            "blocks": len(streamed.blocks),
            "largest_block_bytes": streamed.block_bytes(),
            "parameter_bytes": parameters,
            "outside_blocks_bytes": parameters - in_blocks,
            "carried_activation_bytes": args.pairs * 2 * args.sequence_length * hidden * size,
        }
        measure = lambda: measure_protocols(streamed, reference, downstream, **counts)  # noqa: E731
    _synchronize(device)
    built, built_cpu = time.perf_counter(), time.process_time()
    table = measure()
    _synchronize(device)
    done, done_cpu = time.perf_counter(), time.process_time()
    table.write_parquet(args.out)
    return {
        "side": side,
        "threads": torch.get_num_threads(),
        "peak_rss_bytes": _peak_rss_bytes(),
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_after_imports_bytes": imported,
        "cuda_max_allocated_bytes": (
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        ),
        "build_seconds": built - start,
        "measure_seconds": done - built,
        "total_seconds": done - start,
        "load_seconds_in_measurement": loading[0] if side == "streamed" else None,
        "measure_cpu_seconds": done_cpu - built_cpu,
        "total_cpu_seconds": done_cpu - start_cpu,
        "rows": table.height,
        **sizes,
    }


def _timed(function: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    """``function``, adding the seconds each call takes to ``total[0]``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start

    return timed


def _synchronize(device: Any) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _environment() -> dict[str, str]:
    """This process's environment, with the repository and the vitplasticity it imports
    first on PYTHONPATH, so that a child measures the same code."""
    import vitplasticity

    paths = [str(Path(__file__).resolve().parents[1]), str(Path(vitplasticity.__file__).parents[1])]
    pythonpath = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": pythonpath}


def _command(arguments: list[str]) -> list[str]:
    return [sys.executable, "-m", "benchmarks.streamed", *arguments]


def run_child(
    arguments: list[str],
    variables: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.streamed ARGUMENTS`` in a fresh process, with the environment
    ``variables`` added; raises when it fails (unless ``preexec_fn`` is given: a run under a
    memory limit may fail, and says how)."""
    done = subprocess.run(
        _command(arguments),
        capture_output=True,
        text=True,
        env={**_environment(), **(variables or {})},
        preexec_fn=preexec_fn,
        check=False,
    )
    if done.returncode and preexec_fn is None:
        raise RuntimeError(f"{' '.join(arguments[:2])} failed:\n{done.stderr[-3000:]}")
    return done


def allocator_variables(args: argparse.Namespace) -> dict[str, str]:
    """glibc's fixed mmap threshold for the children (``--malloc-mmap-threshold``): every
    allocation above it is its own mapping, returned to the system when freed; by default the
    threshold grows with the allocations freed (up to 32 MiB), and a freed block's smaller
    tensors may stay in the heap."""
    threshold = args.malloc_mmap_threshold
    return {} if threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(threshold)}


def child_arguments(side: str, weights: Path, args: argparse.Namespace, out: Path) -> list[str]:
    """The command-line arguments of ``side``'s child process."""
    return [
        "--child", side, "--weights", str(weights), "--out", str(out),
        "--pairs", str(args.pairs), "--sequence-length", str(args.sequence_length),
        "--batch-size", str(args.batch_size), "--dtype", args.dtype, "--device", args.device,
        "--threads", str(args.threads),
    ]  # fmt: skip


def compare_tables(whole: Path, streamed: Path) -> dict[str, Any]:
    """Whether the two pair tables are equal, exactly, and their largest relative difference
    (|a - b| / max(|a|, |b|) over ratio, numerator and denominator; 0 where both are NaN)."""
    import numpy as np
    import polars as pl

    keys = ["protocol", "block", "component", "pair"]
    a, b = (pl.read_parquet(path).sort(keys) for path in (whole, streamed))
    same_rows = a.shape == b.shape and a.select(keys).equals(b.select(keys))
    largest = float("nan")
    if same_rows:
        differences = []
        for column in ("ratio", "numerator", "denominator"):
            x, y = a[column].to_numpy(), b[column].to_numpy()
            scale = np.maximum(np.abs(x), np.abs(y))
            with np.errstate(divide="ignore", invalid="ignore"):
                relative = np.where(scale > 0, np.abs(x - y) / scale, 0.0)
            relative = np.where(np.isnan(x) & np.isnan(y), 0.0, relative)
            differences.append(float(np.max(relative, initial=0.0)))
        largest = max(differences)
    return {
        "same_rows": same_rows,
        "rows": a.height,
        "equal": same_rows and a.equals(b),
        "max_relative_difference": largest,
    }


class MemoryCgroup:
    """A cgroup v1 memory controller of ``limit`` bytes under ``root``, removed on exit;
    :meth:`enter` (a ``preexec_fn``) moves the calling process into it."""

    def __init__(self, limit: int, name: str = "vp_stream", root: Path = CGROUP_ROOT) -> None:
        self.limit, self.path = limit, root / name

    def __enter__(self) -> MemoryCgroup:
        self.path.mkdir()
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            swap = self.path / "memory.memsw.limit_in_bytes"  # no swap beyond the limit
            if swap.exists():
                swap.write_text(str(self.limit))
        except OSError:
            self.path.rmdir()
            raise
        return self

    def enter(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def reading(self, name: str) -> str:
        return (self.path / name).read_text().strip()

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # a killed process leaves the cgroup a moment after it is reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        self.path.rmdir()


def limited_runs(
    weights: Path, args: argparse.Namespace, folder: Path, limit: int
) -> dict[str, Any]:
    """Each side's child again inside a :class:`MemoryCgroup` of ``limit`` bytes: its exit
    status and outcome, and the cgroup's own peak and OOM count; ``skipped`` with the reason
    when the cgroup cannot be made."""
    found: dict[str, Any] = {"limit_bytes": limit}
    for side in SIDES:
        try:
            cgroup = MemoryCgroup(limit)
            with cgroup:
                done = run_child(
                    child_arguments(side, weights, args, folder / f"{side}-limited.parquet"),
                    allocator_variables(args),
                    preexec_fn=cgroup.enter,
                )
                oom = dict(
                    line.split() for line in cgroup.reading("memory.oom_control").split("\n")
                )
                peak = int(cgroup.reading("memory.max_usage_in_bytes"))
        except (OSError, subprocess.SubprocessError) as error:  # no cgroup, or cannot join it
            return {"limit_bytes": limit, "skipped": f"no cgroup under {CGROUP_ROOT}: {error}"}
        rc, kills = done.returncode, int(oom.get("oom_kill", -1))
        outcome = "finished" if rc == 0 else "failed"
        if rc == -9:
            outcome = "killed by the OOM killer" if kills > 0 else "killed (SIGKILL)"
        found[side] = {
            "returncode": rc,
            "outcome": outcome,
            "cgroup_max_usage_bytes": peak,
            "oom_kills": kills,
            "result": json.loads(done.stdout.splitlines()[-1]) if rc == 0 else None,
            "stderr_tail": done.stderr[-500:] if rc else "",
        }
    return found


FIGURES = (
    "peak_rss_bytes", "ru_maxrss_bytes", "rss_after_imports_bytes", "cuda_max_allocated_bytes",
    "build_seconds", "measure_seconds", "total_seconds", "load_seconds_in_measurement",
    "measure_cpu_seconds", "total_cpu_seconds",
)  # fmt: skip
"""A child's figures that :func:`run` takes the median of over the repetitions."""


SETTINGS = (
    "size_gb", "tiny", "pairs", "sequence_length", "batch_size", "dtype", "device", "threads",
    "repeats", "memory_limit_gb", "malloc_mmap_threshold",
)  # fmt: skip
"""The options :func:`run`'s result repeats."""


def _median(values: list[Any]) -> Any:
    return None if None in values else statistics.median(values)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark: the checkpoint, both children ``--repeats`` times (whole,
    streamed, whole, ...: medians), the comparison, the limited runs."""
    folder = Path(args.folder or tempfile.mkdtemp(prefix="streamed-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    config = llama_config(args.size_gb, args.sequence_length, args.tiny)
    weights = checkpoint(folder, config)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side in SIDES:
            out = folder / f"{side}.parquet"
            done = run_child(child_arguments(side, weights, args, out), allocator_variables(args))
            runs[side].append(json.loads(done.stdout.splitlines()[-1]))
    sides = {s: {k: _median([r[k] for r in runs[s]]) for k in FIGURES} for s in SIDES}
    whole, streamed = sides["whole"], sides["streamed"]
    sizes = ("blocks", "parameter_bytes", "largest_block_bytes", "outside_blocks_bytes")
    result = {
        "settings": {key: getattr(args, key) for key in SETTINGS},
        "model": {
            "config": config,
            "folder": str(weights),
            "checkpoint_file_bytes": sum(f.stat().st_size for f in weights.glob("*.safetensors")),
            **{key: runs["streamed"][0][key] for key in (*sizes, "carried_activation_bytes")},
        },
        "whole": whole,
        "streamed": streamed,
        "runs": runs,
        "peak_rss_ratio": streamed["peak_rss_bytes"] / whole["peak_rss_bytes"],
        "measure_seconds_ratio": streamed["measure_seconds"] / whole["measure_seconds"],
        "total_seconds_ratio": streamed["total_seconds"] / whole["total_seconds"],
        "measure_seconds_per_1000_pairs_scaled": {
            side: 1000 * sides[side]["measure_seconds"] / args.pairs for side in SIDES
        },
        "tables": compare_tables(folder / "whole.parquet", folder / "streamed.parquet"),
        "machine": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "memory_total_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
    }
    if args.memory_limit_gb:
        limit = int(args.memory_limit_gb * 2**30)
        result["memory_limit"] = limited_runs(weights, args, folder, limit)
    return result


def table(result: dict[str, Any]) -> str:
    """The printed side-by-side table of :func:`run`'s result (medians over the repeats)."""
    whole, streamed, model = result["whole"], result["streamed"], result["model"]
    pairs, repeats = result["settings"]["pairs"], result["settings"]["repeats"]
    rows = [(f"median of {repeats}", "whole", "streamed", "streamed / whole")]

    def row(label: str, key: str, scale: float, digits: int) -> None:
        w, s = whole[key] * scale, streamed[key] * scale
        rows.append((label, f"{w:.{digits}f}", f"{s:.{digits}f}", f"{s / w:.2f}"))

    row("peak RSS, VmHWM (MiB)", "peak_rss_bytes", 1 / MIB, 0)
    row("peak RSS, ru_maxrss (MiB)", "ru_maxrss_bytes", 1 / MIB, 0)
    row("RSS once imported (MiB)", "rss_after_imports_bytes", 1 / MIB, 0)
    if whole["cuda_max_allocated_bytes"] is not None:
        row("torch.cuda.max_memory_allocated (MiB)", "cuda_max_allocated_bytes", 1 / MIB, 0)
    row("build s", "build_seconds", 1, 2)
    row(f"measurement s ({pairs} pairs)", "measure_seconds", 1, 2)
    row("build + measurement s", "total_seconds", 1, 2)
    row("build + measurement, CPU s", "total_cpu_seconds", 1, 2)
    row(f"measurement s per 1,000 pairs (scaled from {pairs})", "measure_seconds", 1000 / pairs, 0)
    if streamed["load_seconds_in_measurement"] is not None:
        load = streamed["load_seconds_in_measurement"]
        rows.append(("of which reading the blocks s", "", f"{load:.2f}", ""))
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)) for row in rows]
    tables = result["tables"]
    lines += [
        "",
        f"checkpoint {model['checkpoint_file_bytes'] / MIB:.0f} MiB on disk (bf16), "
        f"{model['blocks']} blocks; in {result['settings']['dtype']}: parameters "
        f"{model['parameter_bytes'] / MIB:.0f} MiB, largest block "
        f"{model['largest_block_bytes'] / MIB:.1f} MiB, outside the blocks "
        f"{model['outside_blocks_bytes'] / MIB:.1f} MiB, carried activations "
        f"{model['carried_activation_bytes'] / MIB:.2f} MiB",
        f"pair tables ({tables['rows']} rows): equal {tables['equal']}, largest relative "
        f"difference {tables['max_relative_difference']:.3g}",
    ]
    limited = result.get("memory_limit")
    if limited:
        lines.append(f"under a cgroup memory limit of {limited['limit_bytes'] / MIB:.0f} MiB:")
        if "skipped" in limited:
            lines.append(f"  skipped: {limited['skipped']}")
        for side in SIDES:
            if side in limited:
                one = limited[side]
                lines.append(
                    f"  {side}: {one['outcome']} (exit {one['returncode']}, cgroup peak "
                    f"{one['cgroup_max_usage_bytes'] / MIB:.0f} MiB, OOM kills {one['oom_kills']})"
                )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.5, help="bf16 checkpoint size")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (tests)")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side (medians)")
    parser.add_argument("--memory-limit-gb", type=float, default=None, help="GiB; as root")
    parser.add_argument(
        "--malloc-mmap-threshold", type=int, default=None, help="bytes: glibc's, in the children"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--folder", default=None, help="where the checkpoint is kept")
    # A child process's own arguments.
    parser.add_argument("--child", choices=["build", *SIDES], help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse(argv)
    if args.child == "build":
        build_checkpoint(json.loads(args.config), args.out)
        return None
    if args.child:
        print(json.dumps(measure_child(args.child, args)))
        return None
    result = run(args)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
