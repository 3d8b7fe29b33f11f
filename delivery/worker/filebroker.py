"""The embedded default's file broker: kombu's filesystem transport, made safe for several
processes.

kombu's ``filesystem`` transport creates a message's file under its final name and then
writes it, and a consumer takes a file by moving it to the temporary folder (a copy when that
folder is on another file system). A worker that lists the folder between the two steps of a
publish takes an empty file: ``JSONDecodeError`` in the consumer and a lost task, so the
message waited out its dispatch lease (seen as messages stuck ``dispatched`` in the demo).

Here a message is written under a hidden temporary name and renamed into place, so a consumer
only ever sees complete files; and a consumer takes a file by renaming it into the
``processed`` folder of the same file system (atomic: of two consumers, one wins, the other
gets ``FileNotFoundError`` and moves on), reads it and deletes it. An exchange's table of
bindings also comes into being whole (``_queue_bind``). Selected by
``broker_transport`` in ``delivery.worker.app`` for ``filesystem://`` URLs.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps, loads

__all__ = ["TRANSPORT", "WRITING", "Channel", "Transport", "options"]

#: What ``broker_transport`` names for ``filesystem://`` URLs.
TRANSPORT = "delivery.worker.filebroker:Transport"

#: Prefix of a message being written: skipped by consumers and by ``_size``.
WRITING = ".writing-"


class Channel(filesystem.Channel):  # type: ignore[misc]
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        partial = folder / f"{WRITING}{name}"
        try:
            with open(partial, "wb") as f:
                f.write(dumps(payload).encode())  # type: ignore[no-untyped-call]
            os.replace(partial, folder / name)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise ChannelError(f"cannot add a message to {folder}") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        wanted = f"{queue}.msg"
        folder, taken = Path(self.data_folder_in), Path(self.processed_folder)
        for name in sorted(os.listdir(folder)):
            if name.startswith(WRITING) or name.partition(".")[2] != wanted:
                continue
            mine = taken / name
            try:
                os.rename(folder / name, mine)
            except FileNotFoundError:  # another consumer took it first
                continue
            try:
                payload = mine.read_bytes()
            finally:
                if not self.store_processed:
                    mine.unlink(missing_ok=True)
            return loads(payload.decode())  # type: ignore[no-untyped-call]
        raise Empty()

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """kombu creates a missing exchange table empty (``open('wb')``) and only then locks
        and writes it: a second process binding at that instant reads the empty file
        (``JSONDecodeError``). Here the table comes into being with its content, an empty
        list linked into place (one process wins, the others find it), and kombu's locked
        read-modify-write then adds the binding."""
        file = Path(self._exchange_file(exchange))  # type: ignore[no-untyped-call]
        if not file.exists():
            Path(self.control_folder).mkdir(parents=True, exist_ok=True)
            partial = file.with_name(f"{WRITING}{uuid.uuid4()}-{file.name}")
            partial.write_bytes(b"[]")
            try:
                os.link(partial, file)
            except FileExistsError:
                pass
            finally:
                partial.unlink(missing_ok=True)
        super()._queue_bind(exchange, routing_key, pattern, queue)  # type: ignore[no-untyped-call]


class Transport(filesystem.Transport):  # type: ignore[misc]
    Channel = Channel


def options(folder: Path, polling_interval: float = 0.1) -> dict[str, object]:
    """The transport options of a file broker in ``folder`` (created if missing)."""
    (folder / "processed").mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "polling_interval": polling_interval,
        "store_processed": False,
    }
