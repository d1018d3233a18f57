"""SIGTERM (scancel, a killed Snakemake) stops a `prepare` or `reference` job at once and leaves
nothing behind, even when it arrives while the job imports a library that swallows exceptions
raised inside its own imports (torch's extension does, for the numpy it imports); and the
jobs that decode no image do not import torch at all (seconds of start-up per job)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitplasticity.commands.data import exit_on_sigterm

# A module whose import receives SIGTERM and swallows whatever the handler raises, as
# torch._C's initialisation does with an exception from its import of numpy.
SWALLOWING_MODULE = """
import os
import signal

swallowed = []
try:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10_000):  # the handler runs between these bytecodes
        pass
except BaseException as error:
    swallowed.append(error)
"""


def test_sigterm_during_an_import_that_swallows_it_still_stops_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "swallowing_import.py").write_text(SWALLOWING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "swallowing_import", raising=False)
    ran_past_the_import = []
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as stopped, exit_on_sigterm():
        import swallowing_import

        ran_past_the_import.append(True)
        time.sleep(3)  # the job's work: SIGTERM must end it, not wait for its end
    assert stopped.value.code == 128 + signal.SIGTERM
    assert swallowing_import.swallowed == []  # held during the import, not raised into it
    assert time.monotonic() - t0 < 2, "the block ran to its end before stopping"
    # The handlers are restored on the way out.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def run_cli(*command: str) -> subprocess.CompletedProcess[str]:
    """`vitplasticity <command>` in a fresh interpreter; prints whether torch was imported."""
    script = textwrap.dedent(
        f"""
        import sys
        from vitplasticity.cli import main
        code = main({list(command)!r})
        print(json.dumps({{"code": code, "torch": "torch" in sys.modules}}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", "import json\n" + script],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def test_prepare_and_reference_without_images_to_decode_do_not_import_torch(
    tmp_path: Path,
) -> None:
    spec = {"source": "synthetic", "style": "stripes", "num_classes": 4, "n_pool": 32}
    spec |= {"n_test": 16, "image_size": 16, "seed": 1}
    store = tmp_path / "stripes"
    prepared = run_cli(
        "prepare", "--dataset", "stripes", "--spec", json.dumps(spec), "--out", str(store)
    )
    assert json.loads(prepared.stdout) == {"code": 0, "torch": False}, prepared.stderr
    assert (store / "meta.json").is_file()

    out = tmp_path / "reference.parquet"
    reference = run_cli(
        "reference", "--source", "dataset", "--dataset-dir", str(store), "--split", "test",
        "--n-images", "8", "--out", str(out),
    )  # fmt: skip
    assert json.loads(reference.stdout) == {"code": 0, "torch": False}, reference.stderr
    assert out.is_file()


def loading_torch(pid: int) -> bool:
    """Whether process `pid` has mapped torch's library: its `import torch` has begun."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/<pid>/maps")
def test_prepare_stopped_by_sigterm_while_importing_its_decoder_leaves_nothing(
    tmp_path: Path,
) -> None:
    # An image folder: the writer's temporary folder appears, then the decode check imports
    # torch and torchvision (a second or more); SIGTERM is sent once torch's library is mapped.
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (tmp_path / "tree" / label).mkdir(parents=True)
        for i in range(200):
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "tree" / label / f"{i:03d}.png")
    store = tmp_path / "store"
    spec = json.dumps({"source": "image_folder", "root": str(tmp_path / "tree")})
    command = ["prepare", "--dataset", "pets", "--spec", spec, "--out", str(store / "pets")]
    process = subprocess.Popen(
        [sys.executable, "-m", "vitplasticity.cli", *command], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not loading_torch(process.pid) and process.poll() is None:
        assert time.monotonic() < deadline, "torch was never imported"
        time.sleep(0.002)
    assert list(store.glob(".pets.*")), "torch was imported before the writer started"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert list(store.iterdir()) == [], "a stopped prepare left files behind"
