"""The docs' picture of the console: `python examples/main.py` run for real, drawn as a terminal.

    .venv/bin/python scripts/console_screenshot.py [--out docs/assets/console-main-example.png]

Runs the main example in a temporary directory (nothing configured, as the README runs it; colors
on, 110 columns), draws its output with rich as a terminal would show it (the highlighted lines
in color) and has headless Chromium (Debian's ``chromium``, or ``RANKSCOPE_CHROMIUM``) screenshot
the page. Nothing in the picture is typed by hand: rerun it after the console changes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("RANKSCOPE_CHROMIUM", "/usr/bin/chromium")
COLUMNS = 110


def run_main_example(workdir: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "WANDB_"))}
    env |= {"RANKSCOPE_RUNTIME_DIR": str(workdir / "run"), "COLUMNS": str(COLUMNS), "FORCE_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "main.py")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.replace(str(workdir) + os.sep, "")  # the report's path as a person's run shows it


def page(output: str) -> str:
    from rich.console import Console
    from rich.terminal_theme import MONOKAI
    from rich.text import Text

    console = Console(record=True, width=COLUMNS + 2, file=open(os.devnull, "w"), force_terminal=True)  # noqa: SIM115
    console.print(Text("$ python examples/main.py", style="bold"))
    for line in output.rstrip("\n").splitlines():
        console.print(Text.from_ansi(line), no_wrap=True, crop=False)
    html = console.export_html(theme=MONOKAI, inline_styles=True)
    style = "body{margin:0} pre{margin:0;padding:14px;font-size:13px;line-height:1.35;min-height:100vh}"
    return html.replace("</head>", f"<style>{style}</style></head>", 1)


def screenshot(html: str, out: Path, lines: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "console.html"
        source.write_text(html)
        height = 28 + int(lines * 13 * 1.35) + 8
        command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        command += [f"--window-size={int((COLUMNS + 2) * 7.9) + 28},{height}", f"--screenshot={out}"]
        subprocess.run([*command, source.as_uri()], check=True, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "console-main-example.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        output = run_main_example(Path(tmp))
    screenshot(page(output), args.out.resolve(), len(output.splitlines()) + 1)
    print(f"{args.out}: {len(output.splitlines())} lines of console")


if __name__ == "__main__":
    main()
