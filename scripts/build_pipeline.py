"""Build the pipeline's binaries once and cache them: the slim OTel Collector, Jaeger v2 and telemetrygen.

    python scripts/build_pipeline.py          # prints {"otelcol": PATH, "jaeger": PATH, "telemetrygen": PATH}

* The Collector: ``go install`` of the OpenTelemetry Collector Builder (ocb) at the manifest's
  version, then ocb on ``collector-config/builder-config.yaml`` (exactly the components the
  configs in ``collector-config/`` use, core and contrib at one version, plus rankscope's own
  ``rankscopemerge`` processor from the local module in ``collector/``).
* Jaeger v2: ``go build`` of ``github.com/jaegertracing/jaeger/cmd/jaeger`` from the published
  module pinned in ``scripts/jaeger/go.mod`` (with its ``go.sum``).
* telemetrygen (the Collector contrib load generator: OTLP metrics, traces and logs on demand):
  ``go build`` of ``github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen``
  from the published module pinned in ``scripts/telemetrygen/go.mod`` (with its ``go.sum``), at
  the manifest's contrib version.

Binaries go to ``$RANKSCOPE_BIN_CACHE`` (default ``~/.cache/rankscope/bin``) under names keyed by
a hash of their inputs (the manifest and every file of the local modules; a pinned module's go.mod
and go.sum), so a second run (and every test run after the first) builds nothing.
Needs Go >= 1.26 (the Collector and telemetrygen v0.160.0 declare ``go 1.26.0``) and the Go module
proxy. ``GOSUMDB`` defaults to off for these builds: the checksum database is not reachable for
every module everywhere, and the Jaeger and telemetrygen builds are pinned by their committed go.sum
anyway; set ``GOSUMDB`` yourself to enforce it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "collector-config" / "builder-config.yaml"
LOCAL_MODULES = ROOT / "collector"  # rankscope's own Collector components (Go modules)
JAEGER_MODULE = ROOT / "scripts" / "jaeger"
TELEMETRYGEN_MODULE = ROOT / "scripts" / "telemetrygen"


def cache_dir() -> Path:
    found = os.environ.get("RANKSCOPE_BIN_CACHE")
    return Path(found) if found else Path.home() / ".cache" / "rankscope" / "bin"


def _digest(*paths: Path) -> str:
    """A hash of the files (a directory: every file under it, by relative path) the build reads."""
    h = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            h.update(str(file.relative_to(ROOT)).encode())
            h.update(file.read_bytes())
    return h.hexdigest()[:12]


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOSUMDB", "off")
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def _say(message: str) -> None:
    print(f"build_pipeline: {message}", file=sys.stderr, flush=True)


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    started = time.monotonic()
    _say(f"$ {' '.join(command)}")
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise SystemExit(f"build_pipeline: {command[0]} failed ({result.returncode}):\n{tail}")
    _say(f"  done in {time.monotonic() - started:.0f}s")


def collector() -> Path:
    """The Collector built from the manifest (cached by the manifest's hash)."""
    target = cache_dir() / f"otelcol-rankscope-{_digest(MANIFEST, LOCAL_MODULES)}"
    if target.exists():
        return target
    version = re.search(r"^\s*version:\s*(\S+)", MANIFEST.read_text(), re.M)
    if version is None:
        raise SystemExit(f"build_pipeline: no dist version in {MANIFEST}")
    env = _go_env()
    with tempfile.TemporaryDirectory(prefix="rankscope-ocb-") as work:
        work_dir = Path(work)
        env["GOBIN"] = str(work_dir / "bin")
        _say(f"building the Collector {version.group(1)} with ocb (a few minutes, once)")
        _run(["go", "install", f"go.opentelemetry.io/collector/cmd/builder@v{version.group(1)}"], work_dir, env)
        manifest = work_dir / "builder-config.yaml"
        text = re.sub(r"output_path:.*", f"output_path: {work_dir / 'dist'}", MANIFEST.read_text())
        # A local module's path is relative to the manifest; the copy lives elsewhere.
        text = re.sub(r"(\bpath:\s*)(\S+)", lambda m: m.group(1) + str((MANIFEST.parent / m.group(2)).resolve()), text)
        manifest.write_text(text)
        _run([str(work_dir / "bin" / "builder"), "--config", str(manifest)], work_dir, env)
        _install(work_dir / "dist" / "otelcol-rankscope", target)
    return target


def _pinned(module: Path, package: str, name: str, what: str) -> Path:
    """``go build`` of ``package`` from the published module pinned in ``module`` (go.mod, go.sum,
    tools.go), cached as ``name-<digest of go.mod and go.sum>``."""
    target = cache_dir() / f"{name}-{_digest(module / 'go.mod', module / 'go.sum')}"
    if target.exists():
        return target
    env = _go_env()
    with tempfile.TemporaryDirectory(prefix=f"rankscope-{name}-") as work:
        work_dir = Path(work)
        for file in ("go.mod", "go.sum", "tools.go"):
            shutil.copy(module / file, work_dir / file)
        _say(f"building {what} (a few minutes, once)")
        out = work_dir / name
        _run(["go", "build", "-o", str(out), package], work_dir, env)
        _install(out, target)
    return target


def jaeger() -> Path:
    """Jaeger v2 from its published module (cached by the pinned go.mod/go.sum)."""
    return _pinned(JAEGER_MODULE, "github.com/jaegertracing/jaeger/cmd/jaeger", "jaeger", "Jaeger v2")


def telemetrygen() -> Path:
    """telemetrygen from its published module (cached by the pinned go.mod/go.sum)."""
    return _pinned(
        TELEMETRYGEN_MODULE,
        "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen",
        "telemetrygen",
        "telemetrygen",
    )


def _install(built: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    shutil.copy2(built, partial)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent build never sees half a binary
    _say(f"cached {target}")


def main() -> int:
    if shutil.which("go") is None:
        print("build_pipeline: Go is not installed (https://go.dev/doc/install)", file=sys.stderr)
        return 2
    print(json.dumps({"otelcol": str(collector()), "jaeger": str(jaeger()), "telemetrygen": str(telemetrygen())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
