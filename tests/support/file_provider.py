"""A provider whose instances live in a JSON file, for tests that SIGKILL the executor.

An in-memory fake forgets everything with the process it lives in, so it cannot show that a
restarted executor finds the instance its killed predecessor made. This one keeps its state on
disk, like a cloud keeps VMs, and counts real creations so a test can assert "made once".
``create_delay`` holds ``create`` open *after* the instance exists: the window in which a kill
leaves an instance at the provider and no ``InstanceCreated`` in the log.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from events.schemas import InstanceState
from services.providers.base import CreateRequest, Instance, NotFound


class FileProvider:
    type = "file"

    def __init__(
        self,
        path: Path,
        name: str = "disk",
        *,
        pending_polls: int = 0,
        create_delay: float = 0.0,
    ) -> None:
        self.path = path
        self.name = name
        self.pending_polls = pending_polls
        self.create_delay = create_delay
        self._lock = asyncio.Lock()

    def load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"created_total": 0, "instances": {}}
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data

    def _save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    async def create(self, request: CreateRequest) -> str:
        provider_id = f"disk-{request.name}"
        async with self._lock:
            data = self.load()
            if provider_id not in data["instances"]:
                data["created_total"] += 1
                data["instances"][provider_id] = {
                    "name": request.name,
                    "owner": request.owner_uid,
                    "created_at": datetime.now(UTC).isoformat(),
                    "polls": 0,
                }
                self._save(data)
        await asyncio.sleep(self.create_delay)
        return provider_id

    async def get(self, provider_id: str) -> Instance:
        async with self._lock:
            data = self.load()
            record = data["instances"].get(provider_id)
            if record is None:
                raise NotFound(f"{self.name}: no instance {provider_id}")
            record["polls"] += 1
            self._save(data)
        running = record["polls"] > self.pending_polls
        return Instance(
            provider_id=provider_id,
            name=record["name"],
            state=InstanceState.RUNNING if running else InstanceState.PENDING,
            owner_uid=record["owner"],
            created_at=datetime.fromisoformat(record["created_at"]),
            ip="127.0.0.9" if running else "",
        )

    async def delete(self, provider_id: str) -> None:
        async with self._lock:
            data = self.load()
            if data["instances"].pop(provider_id, None) is not None:
                self._save(data)

    async def list_by_tag(self) -> list[Instance]:
        return [await self.get(pid) for pid in self.load()["instances"]]

    async def close(self) -> None:
        return None
