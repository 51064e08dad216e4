"""A real terminal for tests that read what a person sees: a tmux pane on a private tmux server,
running one shell command, its screen (and scrollback) read back as text."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path


class Pane:
    """``command`` in a tmux pane of ``width`` x ``height``; the pane stays once it exits."""

    def __init__(self, env: dict[str, str], cwd: Path, command: str, width: int = 80, height: int = 50) -> None:
        self.server = f"rankscope-pane-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        shell = f'{command}; echo "pane command exited $?"; sleep 600'  # what it left stays on the pane
        size = ["-x", str(width), "-y", str(height)]
        started = subprocess.run(
            [
                "tmux",
                "-L",
                self.server,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                "pane",
                *size,
                "-c",
                str(cwd),
                shell,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert started.returncode == 0, f"tmux did not start: {started.stderr}"

    def tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.server, "-f", "/dev/null", *args], env=env, capture_output=True, text=True, timeout=10
        )
        return done.stdout

    def screen(self, history: bool = False) -> str:
        """The visible screen, or with ``history`` the scrollback too."""
        return self.tmux("capture-pane", "-p", "-t", "pane", *(["-S", "-"] if history else []))

    def until(self, shown: Callable[[str], bool], seconds: float, what: str, history: bool = False) -> str:
        deadline = time.monotonic() + seconds
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen(history)
            if shown(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{what} never shown in {seconds:.0f}s; the screen:\n{screen}")

    def close(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            socket = self.tmux("display-message", "-p", "#{socket_path}").strip()
            self.tmux("kill-server")  # the command and the pane's shell get SIGHUP
            if socket:
                Path(socket).unlink(missing_ok=True)
