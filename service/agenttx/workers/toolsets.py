"""Keeping the toolset registry current: `--toolsets-file` re-read when it changes, and
the operator's published toolsets watched under `<prefix>/toolsets/` (docs/toolsets.md).

Why a watch and a poll, not a read per step: a step must not pay for finding its tools,
and service pods need no Kubernetes API access (the operator publishes, replicas
listen). The file is checked every FILE_POLL_S seconds (a `stat` signature, as token
files are), so an edit reaches every replica well within 30 s; a Secret-backed header
file needs no reload at all (its value is read per call, tools/toolsets/upstream.py).

A broken toolset (an entry of the file or a published record that does not validate) is
logged and skipped, never fatal, and costs no other toolset; a file that does not parse
at all is logged and the toolsets last read from it stay in force.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import yaml

from ..contracts.layout import Keys
from ..contracts.toolsets import Toolset, ToolsetError, parse_file, parse_published
from ..store.client import Store
from ..store.ops import KeyValue, WatchEvent
from ..store.watch import Watch
from ..tasks import BackgroundTasks
from ..tools.toolsets import Toolsets

log = logging.getLogger(__name__)

FILE_POLL_S = 2.0


def read_toolsets_file(path: str) -> tuple[list[Toolset], list[str]]:
    """Read and parse a toolsets file. Raises ToolsetError / OSError."""
    with open(path, "rb") as f:
        return parse_toolsets_file(f.read(), path)


def parse_toolsets_file(raw: bytes, path: str) -> tuple[list[Toolset], list[str]]:
    """A toolsets file's content (YAML or JSON): the valid toolsets, and why each
    invalid one is skipped (a broken toolset never costs the others). Raises
    ToolsetError, saying where, when the file as a whole is unreadable."""
    try:
        doc: Any = json.loads(raw) if raw.lstrip().startswith(b"{") else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise ToolsetError(f"{path}: not valid YAML or JSON{where}") from None
    doc = doc if doc is not None else {}
    entries = doc.get("toolsets") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        parse_file(doc)            # raises, naming what is wrong with the file's shape
        return [], []
    good: list[Toolset] = []
    skipped: list[str] = []
    for i, entry in enumerate(entries):
        try:
            [toolset] = parse_file({**doc, "toolsets": [entry]})
        except ToolsetError as exc:
            skipped.append(str(exc).replace("toolsets[0]", f"toolsets[{i}]", 1))
            continue
        if any(t.key == toolset.key for t in good):
            skipped.append(f"toolsets[{i}]: {toolset.key} is declared more than once")
            continue
        good.append(toolset)
    return good, skipped


class PublishedToolsets(Watch):
    """The operator's toolsets under `<prefix>/toolsets/`, kept current by the store's one
    watch loop (store.watch)."""

    def __init__(self, store: Store, keys: Keys, toolsets: Toolsets) -> None:
        super().__init__(store, keys.toolsets_prefix(), prefix=True, what="toolsets")
        self.keys, self.toolsets = keys, toolsets

    def _parse(self, key: bytes, value: bytes) -> tuple[str, Toolset | None] | None:
        """(`<ns>/<name>`, the toolset or None when malformed), None for a foreign key."""
        ident = self.keys.toolset_of(key)
        if ident is None:
            return None
        suffix = f"{ident[0]}/{ident[1]}"
        try:
            toolset = parse_published(value)
        except ToolsetError as exc:
            log.error("ignoring a malformed published toolset",
                      extra={"key": key.decode(errors="replace"), "error": str(exc)})
            return suffix, None
        if toolset.key != suffix:
            log.error("ignoring a published toolset stored under another name",
                      extra={"key": key.decode(errors="replace"), "toolset": toolset.key})
            return suffix, None
        return suffix, toolset

    def on_snapshot(self, kvs: Sequence[KeyValue], revision: int) -> None:
        found: dict[str, Toolset] = {}
        for kv in kvs:
            parsed = self._parse(kv.key, kv.value)
            if parsed is not None and parsed[1] is not None:
                found[parsed[0]] = parsed[1]
        self.toolsets.replace_published(found)

    def on_event(self, event: WatchEvent) -> None:
        if event.value is None:
            ident = self.keys.toolset_of(event.key)
            if ident is not None:
                self.toolsets.set_published(f"{ident[0]}/{ident[1]}", None)
            return
        parsed = self._parse(event.key, event.value)
        if parsed is not None:
            self.toolsets.set_published(*parsed)


class ToolsetSources:
    """Feeds `Toolsets` from the file and from etcd; runs until stopped."""

    def __init__(self, store: Store, keys: Keys, toolsets: Toolsets, *,
                 file: str | None = None, refresh_s: float = 300.0) -> None:
        self.toolsets = toolsets
        self.file = file
        self.refresh_s = refresh_s
        self.published = PublishedToolsets(store, keys, toolsets)
        self._signature: tuple[int, ...] | None = None
        self._tasks = BackgroundTasks("toolsets")

    # ---- the file ----------------------------------------------------------------------

    async def check_file(self) -> bool:
        """Re-read the file if it changed; True when the registry was updated."""
        if not self.file:
            return False
        try:
            st = await asyncio.to_thread(os.stat, self.file)
        except OSError as exc:
            if self._signature != ():
                log.error("cannot read --toolsets-file",
                          extra={"file": self.file, "error": exc.strerror or str(exc),
                                 "kept": "the toolsets last read from it"})
                self._signature = ()
            return False
        signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            loaded, skipped = await asyncio.to_thread(read_toolsets_file, self.file)
        except (OSError, ToolsetError) as exc:
            log.error("ignoring an invalid --toolsets-file",
                      extra={"file": self.file, "error": str(exc),
                             "kept": "the toolsets last read from it"})
            return False
        for reason in skipped:
            log.error("skipping an invalid toolset", extra={"file": self.file,
                                                             "error": reason})
        self.toolsets.set_file(loaded)
        log.info("toolsets file read", extra={"file": self.file,
                                              "toolsets": [t.key for t in loaded]})
        return True

    async def _poll_file(self) -> None:
        while True:
            await asyncio.sleep(FILE_POLL_S)
            try:
                await self.check_file()
            except Exception as exc:  # never let the poll die
                log.warning("toolsets file check failed", extra={"error": str(exc)})

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            started = time.monotonic()
            await self.toolsets.refresh()
            log.debug("toolset listings refreshed",
                      extra={"ms": round((time.monotonic() - started) * 1000)})

    # ---- lifecycle -----------------------------------------------------------------------

    async def load(self) -> None:
        """The published toolsets as they are now (one read); the watch follows them."""
        await self.published.load()

    async def start(self) -> None:
        """Read the file now (a broken one is logged, not fatal), then keep watching."""
        await self.check_file()
        if self.file:
            self._tasks.start(self._poll_file(), name="toolsets-file")
        self.published.start()
        self._tasks.start(self._refresh(), name="toolsets-refresh")

    async def stop(self) -> None:
        await self._tasks.stop()
        await self.published.stop()
        await self.toolsets.close()


__all__ = ["FILE_POLL_S", "PublishedToolsets", "ToolsetSources", "parse_toolsets_file", "read_toolsets_file"]
