"""A headless Chromium the browser tests drive over the DevTools protocol, through a pipe (no port, no websocket).

``--remote-debugging-pipe`` makes Chromium read commands from fd 3 and write answers to fd 4, each a JSON object
ended by a NUL byte. One browser serves a whole test module: ``Browser.open(url, width)`` opens a tab of that width
and ``Tab.evaluate`` runs JavaScript in it, so a test measures the page as laid out (``scrollWidth``, boxes) instead
of trusting what the page says about itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM", "HEADLESS", "Browser", "Tab"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: the flags every test's Chromium runs with: headless, no sandbox, GPU or network services
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class Browser:
    """One headless Chromium; close it with ``close()`` (or use it as a context manager)."""

    def __init__(self, profile_dir: Path, timeout_s: float = 60.0) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
        self.timeout_s = timeout_s
        to_chromium, self._w = os.pipe()
        self._r, from_chromium = os.pipe()

        def onto_3_and_4() -> None:  # in the child, before exec: fd 3 is what it reads, fd 4 what it writes
            os.dup2(to_chromium, 3)
            os.dup2(from_chromium, 4)

        args = [
            CHROMIUM,
            *HEADLESS,
            "--remote-debugging-pipe",
            f"--user-data-dir={profile_dir}",
            "about:blank",
        ]
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_chromium, from_chromium, 3, 4),
            preexec_fn=onto_3_and_4,
        )
        os.close(to_chromium)
        os.close(from_chromium)
        self._buf = b""
        self._id = 0

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its ``result`` (events in between are dropped)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" not in self._buf:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise RuntimeError(f"chromium did not answer {method} (exit code {self._proc.poll()})")
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe during {method}")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})  # type: ignore[no-any-return]

    def open(self, url: str, width: int, height: int = 1000) -> Tab:
        """A new tab ``width`` pixels wide showing ``url`` (not waited for: see ``Tab.wait``)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", metrics, session)
        self.call("Page.navigate", {"url": url}, session)
        return Tab(self, target, session)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # it may be gone already
            self.call("Browser.close")
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._w)
        os.close(self._r)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Tab:
    """One page of a ``Browser``."""

    def __init__(self, browser: Browser, target: str, session: str) -> None:
        self.browser, self.target, self.session = browser, target, session

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (JSON-serialisable) in the page."""
        params = {"expression": expression, "returnByValue": True}
        result = self.browser.call("Runtime.evaluate", params, self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy; its value. Raises ``TimeoutError`` naming it otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true after {timeout_s} s: {expression}")
            time.sleep(0.1)

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})
