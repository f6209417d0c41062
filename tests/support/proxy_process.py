"""The proxy as a separate process (`bmx-rerank serve`, exactly as deployed), for the soak and writes
benchmarks and their CI versions: start it, wait until it answers, read its RSS, stop it; and the RSS
of any process (the fuzzing benchmark's child, a test's own)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.net import free_port

BIN = Path(sys.executable).parent / "bmx-rerank"


@dataclass
class Proxy:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def rss_kib(self) -> int:
        return proc_status(self.proc.pid)["VmRSS"]

    def peak_kib(self) -> int:
        return proc_status(self.proc.pid)["VmHWM"]

    def reset_peak(self) -> None:
        """Start the peak RSS (VmHWM) over from the RSS now (Linux 4.0+: `5` into clear_refs)."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as fh:
            fh.write("5")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process (this one by default), KiB, from /proc."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0])
    return out


@contextlib.contextmanager
def serve(
    upstream: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None, log: Path | None = None
) -> Iterator[Proxy]:
    """`bmx-rerank serve --upstream URL` on a free loopback port; stopped (SIGTERM) on exit. Its log
    goes to `log`, else to /tmp/bmx-proxy-PORT.log, removed on exit unless what ran in it failed."""
    port = free_port()
    keep, log = log is not None, log or Path(f"/tmp/bmx-proxy-{port}.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN), "serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_bmx/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the proxy did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield Proxy(url, proc, log)
    except BaseException:
        keep = True
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if not keep:
            log.unlink(missing_ok=True)
