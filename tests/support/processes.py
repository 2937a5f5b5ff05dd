"""Which processes run, read from /proc as a person would with `ps`: for tests that
promise no etcd outlives its service (docs/architecture.md, "The embedded etcd").

Scoped to one data dir, never "every etcd on the machine": other tests and other
people's services run etcds of their own beside these tests.
"""

from __future__ import annotations

import pathlib

from agenttx.embedded_etcd import etcd_data_dir_of


def etcds_on(data_dir: pathlib.Path) -> list[int]:
    """Pids of the live etcd processes whose --data-dir lies under `data_dir`."""
    root = data_dir.resolve()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            runs_on = etcd_data_dir_of(int(entry.name))
        except OSError:
            continue
        if runs_on is not None and pathlib.Path(runs_on).resolve().is_relative_to(root):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited; it only waits for its parent)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


__all__ = ["alive", "etcds_on"]
