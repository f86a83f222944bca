"""A real headless Chromium driven over the DevTools protocol on a pipe (no port to guard).

`--remote-debugging-pipe` makes Chromium read commands on fd 3 and write replies and events
on fd 4, each a JSON message ended by a NUL byte. `Browser.open(url)` attaches to the page;
`wait_for(js)` polls an expression, bounded; `screenshot(path)` writes a PNG.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.waiting import wait_until

CHROMIUM = "chromium"
MOVE_FDS_AND_EXEC = ("import os, sys; a, b = int(sys.argv[1]), int(sys.argv[2]); os.dup2(a, 3); os.dup2(b, 4); "
                     "os.close(a); os.close(b); os.execv(sys.argv[3], sys.argv[3:])")


def chromium_binary() -> str:
    found = shutil.which(CHROMIUM)
    if found is None:
        raise AssertionError("Chromium is not installed: `make test` installs it (apt-get install chromium, as root)")
    return found


class Browser:
    def __init__(self, profile: Path, width: int = 1280, height: int = 1100) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # The child must find them at fds 3 and 4: a small Python shim moves them there and
        # execs Chromium (no preexec_fn, which is unsafe in a process with threads). They are
        # first put above 9 so that moving one never overwrites the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w)]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", MOVE_FDS_AND_EXEC, str(high[0]), str(high[1]), chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-extensions",
             "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=tuple(high))
        for fd in (to_child_r, from_child_w, *high):
            os.close(fd)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self._arrived = threading.Condition()
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._arrived:
                    self._replies[-1] = {"error": {"message": "Chromium closed the pipe"}}
                    self._arrived.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._arrived:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                self._arrived.notify_all()

    def send(self, method: str, params: dict | None = None, timeout_s: float = 30.0, session: bool = True) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while self._next_id not in self._replies:
                left = deadline - time.monotonic()
                if -1 in self._replies or left <= 0:
                    raise AssertionError(f"Chromium did not answer {method} within {timeout_s}s: "
                                         f"{self._replies.get(-1, 'no reply')}")
                self._arrived.wait(left)
            reply = self._replies.pop(self._next_id)
        if "error" in reply:
            raise AssertionError(f"Chromium refused {method}: {reply['error']}")
        return reply["result"]

    def open(self, url: str) -> None:
        if self.session is None:
            page = next(t for t in self.send("Target.getTargets", session=False)["targetInfos"] if t["type"] == "page")
            self.session = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True},
                                     session=False)["sessionId"]
            for domain in ("Page", "Runtime", "Network"):
                self.send(f"{domain}.enable")
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str, every_s: float = 0.1):
        return wait_until(lambda: self.evaluate(expression), timeout_s, f"{what} ({expression})", every_s)

    def requested_urls(self) -> list[str]:
        """Every URL the pages asked for, except those the page's policy blocked before any
        byte left the browser (Content-Security-Policy)."""
        with self._arrived:
            blocked = {e["params"]["requestId"] for e in self.events if e.get("method") == "Network.loadingFailed"
                       and e["params"].get("blockedReason") == "csp"}
            return [e["params"]["request"]["url"] for e in self.events
                    if e.get("method") == "Network.requestWillBeSent" and e["params"]["requestId"] not in blocked]

    def blocked_urls(self) -> list[str]:
        """URLs the page's Content-Security-Policy refused to fetch."""
        with self._arrived:
            blocked = {e["params"]["requestId"] for e in self.events if e.get("method") == "Network.loadingFailed"
                       and e["params"].get("blockedReason") == "csp"}
            return [e["params"]["request"]["url"] for e in self.events
                    if e.get("method") == "Network.requestWillBeSent" and e["params"]["requestId"] in blocked]

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout_s=5)
        except AssertionError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._to_child)
        self._reader.join(5)
        os.close(self._from_child)
