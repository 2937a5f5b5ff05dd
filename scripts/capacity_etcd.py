"""What one etcd cluster carries of AgentTx's load: step-shaped transactions per second
(docs/architecture.md, "Capacity").

A successful step is ONE etcd Txn: a compare on the transaction header's mod_revision and
about four puts (the header, the step record, the touched-key entry, the history entry;
~1.5 KB in all for a kv.put). This replays exactly that shape, with no AgentTx replica in
between, from `--procs` client processes × `--clients` concurrent clients each (every
client its own "transaction": its own header key), against an embedded etcd of
`--members` members on loopback (data on tmpfs), and prints the Txn/s it sustained.

On the 2-core development machine the Python clients and all etcd members share the two
cores, so the figure is a floor of what the cluster itself can do.

    .venv/bin/python scripts/capacity_etcd.py --members 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time
import uuid

from agenttx.embedded_etcd import EmbeddedEtcd

# The sizes of a kv.put step's puts as the engine writes them (bytes, measured from a
# real step: header, record, touched entry, history entry).
PUTS = (620, 430, 160, 330)


def _client_proc(endpoint: str, clients: int, seconds: float, out: multiprocessing.Queue
                 ) -> None:
    import aetcd
    from aetcd import rpc

    host, _, port = endpoint.rpartition(":")

    async def run() -> int:
        async with aetcd.Client(host, int(port), timeout=10) as etcd:
            kv = etcd.kvstub
            done = 0
            stop_at = time.perf_counter() + seconds

            async def client() -> None:
                nonlocal done
                tx = f"/cap/{uuid.uuid4().hex}"
                header = f"{tx}/h".encode()
                rev = (await etcd.put(header, b"x" * PUTS[0])).header.revision
                step = 0
                while time.perf_counter() < stop_at:
                    step += 1
                    req = rpc.TxnRequest()
                    c = req.compare.add()
                    c.key, c.result, c.target, c.mod_revision = (
                        header, rpc.Compare.EQUAL, rpc.Compare.MOD, rev)
                    for key, size in zip((header, f"{tx}/s/{step}".encode(),
                                          f"{tx}/t/{step}".encode(), f"{tx}/y/{step}".encode()),
                                         PUTS, strict=True):
                        put = req.success.add().request_put
                        put.key, put.value = key, b"x" * size
                    resp = await kv.Txn(req, timeout=10)
                    if not resp.succeeded:
                        raise RuntimeError("lost a compare nobody else could move")
                    rev = resp.header.revision
                    done += 1

            await asyncio.gather(*(client() for _ in range(clients)))
            return done

    out.put(asyncio.run(run()))


def measure(endpoint: str, procs: int, clients: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    workers = [ctx.Process(target=_client_proc, args=(endpoint, clients, seconds, out))
               for _ in range(procs)]
    for w in workers:
        w.start()
    total = sum(out.get(timeout=seconds + 120) for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=8.0)
    ns = parser.parse_args()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agenttx-capacity-", dir=shm) as d:
        etcd = EmbeddedEtcd(pathlib.Path(d) / "etcd", members=ns.members).start()
        try:
            rows = []
            for clients in ns.clients:
                per_s = measure(etcd.endpoints[0], ns.procs, clients, ns.seconds)
                rows.append({"members": ns.members, "client_procs": ns.procs,
                             "clients_per_proc": clients, "step_txns_per_s": round(per_s, 1)})
                print(json.dumps(rows[-1]), flush=True)
            print(json.dumps({"loadavg": pathlib.Path("/proc/loadavg").read_text().split()[:3],
                              "rows": rows}))
        finally:
            etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
