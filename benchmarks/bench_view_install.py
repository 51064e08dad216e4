"""What a view's extra costs to install (issue 54): ``rankscope[mlflow]``'s package against W&B's.

Each arm is a fresh virtual environment (``python -m venv``) into which pip installs one
requirement with its dependencies: ``mlflow-skinny>=3.0`` (what the ``mlflow`` extra adds: the
view talks to a server, so MLflow's client is enough) and, as the peer, ``wandb`` (the W&B view's
package, which rankscope installs already). The ``otlp`` view needs nothing beyond rankscope's
own dependencies (grpcio and the OTLP protos). Arms alternate, ``--rounds`` times, pip's cache
warm after the first round (the first round's figures are printed apart: a download's time says
more about the network than the package). Per arm: the median seconds of pip, the packages it
installed and their size on disk, and the ratio of the extra to the peer.

Run from the repository root:  python benchmarks/bench_view_install.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = {"mlflow extra (mlflow-skinny>=3.0)": "mlflow-skinny>=3.0", "peer: wandb": "wandb"}


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def install(requirement: str) -> tuple[float, int, int]:
    """(pip's seconds, packages installed, bytes of site-packages) in a fresh venv."""
    with tempfile.TemporaryDirectory(prefix="bench-install-") as work:
        venv = Path(work) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        python = venv / "bin" / "python"
        site = Path(
            subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        before = {p.name for p in site.glob("*.dist-info")}
        empty = size_of(site)
        started = time.monotonic()
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        took = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"pip install {requirement} failed:\n{done.stderr[-3000:]}")
        added = {p.name for p in site.glob("*.dist-info")} - before
        return took, len(added), size_of(site) - empty


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    found: dict[str, list[tuple[float, int, int]]] = {arm: [] for arm in ARMS}
    for i in range(args.rounds):
        order = list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]
        for arm in order:
            found[arm].append(install(ARMS[arm]))
        figures = ", ".join(f"{a} {found[a][-1][0]:.1f} s" for a in ARMS)
        print(f"round {i + 1}/{args.rounds}: {figures}", flush=True)
    print(
        f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, pip's cache warm after round 1"
    )
    warm = {arm: [t for t, _, _ in runs[1:]] or [runs[0][0]] for arm, runs in found.items()}
    for arm, runs in found.items():
        seconds = warm[arm]
        _, packages, size = runs[-1]
        print(
            f"{arm:36s} {statistics.median(seconds):6.1f} s ({min(seconds):.1f}-{max(seconds):.1f}), "
            f"first round {runs[0][0]:.1f} s; {packages} packages, {size / 1e6:.0f} MB"
        )
    extra, peer = (statistics.median(warm[a]) for a in ARMS)
    print(f"ratio mlflow extra / wandb: {extra / peer:.2f}x")


if __name__ == "__main__":
    main()
