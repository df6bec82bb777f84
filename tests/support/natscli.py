"""The real ``nats`` CLI (natscli v0.5.0, a peer built by deploy/peers.sh) run with one context
file, as docs/nats-cli.md tells an operator to, and nothing from this machine's NATS_* variables or
~/.config/nats."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.peers import peer


class NatsCli:
    """The ``nats`` binary with one context file (``egress-proxies up`` writes the reader's and
    the admin's), and nothing from this machine's NATS_* variables or ~/.config/nats."""

    def __init__(self, context: Path, home: Path, *, timeout: str = "") -> None:
        """``timeout`` (``--timeout``, e.g. ``"2s"``) bounds each JetStream API request: a request
        the server refuses gets no reply, and the CLI waits that long before it exits."""
        self.binary = str(peer("nats"))
        self.context = context
        self.timeout = timeout
        home.mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
        self.env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))

    def argv(self, *args: str) -> list[str]:
        limit = [f"--timeout={self.timeout}"] if self.timeout else []
        return [self.binary, "--context", str(self.context), *limit, *args]

    async def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            self.argv(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    async def run_all(
        self, commands: list[tuple[str, ...]]
    ) -> list[subprocess.CompletedProcess[str]]:
        """Every command at once, the answers in their order: for commands that each wait out
        the timeout (a refused request), which one after another would add up."""

        async def one(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
            process = await asyncio.create_subprocess_exec(
                *self.argv(*args),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(process.communicate(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
                raise
            code = process.returncode
            assert code is not None
            return subprocess.CompletedProcess(list(args), code, out.decode(), err.decode())

        return list(await asyncio.gather(*(one(args) for args in commands)))

    async def ok(self, *args: str) -> str:
        done = await self.run(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    async def refused(self, *args: str, because: str) -> None:
        done = await self.run(*args)
        assert done.returncode != 0, (args, done.stdout)
        assert because in done.stderr, (args, done.stderr)

    async def json(self, *args: str) -> Any:
        return json.loads(await self.ok(*args, "--json"))

    async def view(self, stream: str, subject: str) -> str:
        """``nats stream view`` pages interactively and refuses to run without a terminal: it
        gets a pseudo-terminal. One page of 25 holds the whole history here; a "Next Page?"
        prompt would leave it waiting, and fail the read."""
        return await asyncio.to_thread(
            self._on_terminal, "stream", "view", stream, "25", "--subject", subject
        )

    def _on_terminal(self, *args: str, timeout: float = 30.0) -> str:
        primary, secondary = pty.openpty()
        process = subprocess.Popen(
            self.argv(*args),
            env=self.env,
            stdin=secondary,
            stdout=secondary,
            stderr=subprocess.PIPE,
        )
        os.close(secondary)
        out = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                assert left > 0, f"nats {' '.join(args)} did not finish:\n{out.decode()}"
                ready, _, _ = select.select([primary], [], [], left)
                if not ready:
                    continue
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the program closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            assert process.wait(timeout=10) == 0, (args, out.decode(), process.stderr)
        finally:
            os.close(primary)
            if process.poll() is None:
                process.kill()
                process.wait()
            assert process.stderr is not None
            process.stderr.close()
        return out.decode().replace("\r\n", "\n")
