"""The task suite: multi-step business tasks written for this benchmark, each with a known
correct final state.

Six families, cycled (task i is family i mod 6, variant i div 6), so any `--tasks N`
gives a balanced suite; the 30-task default has five variants of each:

* ``order``    order fulfilment: read the order request, draft it, insert the order and
               its line items (foreign keys to customers, orders, products), take the
               stock from kv counters, write the invoice, read it back, send the
               confirmation webhook (9 or 12 calls);
* ``triage``   two support tickets: read the roster and each ticket, record the triage,
               insert the assignment (FK to agents), bump the assignee's load counter,
               notify the assignee (13 calls, one atomic group per ticket);
* ``move``     move stock between two warehouse counters, with a move record (FK to
               products), a manifest file read back and a webhook (10 calls);
* ``billing``  bill a customer's usage: read customer and plan, draft the invoice from
               the usage counter, insert it, reset the counter, write and re-read the
               document, email it by webhook (9 calls);
* ``refund``   a refund against an existing order (a lookup that can miss), credit the
               customer, notify finance mid-task, write and re-read the receipt, send it
               (10 calls);
* ``onboard``  a signup: customer and account rows (FK to plans, customers), a welcome
               webhook mid-task, the plan's seat counter, a welcome document read back
               into the CRM record (10 calls).

Each task derives its own values from what it reads (`Calc`: the request file parsed,
counters read then written), names what it produced by reference (`Ref`, so AgentTx can
trace provenance), and marks where a concurrent writer could interfere (`conflict_delta`)
or where the agent could derive a wrong id (`wrong`). The names are built inside the
run's namespace, so runs never touch each other's data.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .plan import Calc, Fmt, Op, Outputs, Ref, Task
from .state import State

FAMILIES = ("order", "triage", "move", "billing", "refund", "onboard")
NAMES = ("Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra", "Barbara Liskov",
         "Ken Thompson", "Radia Perlman", "Donald Knuth", "Frances Allen", "John Backus")


def _doc(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _read_json(label: str) -> Callable[[Outputs], Any]:
    return lambda o: json.loads(o[label]["contents"])


def _counter(label: str, delta: int) -> Calc:
    """The new value of a counter the agent read at op `label`."""
    return Calc(lambda o: o[label]["value"] + delta)


def _webhook(payload: dict[str, Any], key: str) -> dict[str, Any]:
    return {"channel": "webhook", "payload": payload, "idempotency_key": key}


# ---- order fulfilment -------------------------------------------------------------------

def _order(v: int, ns: str) -> Task:
    def n(s: str) -> str:
        return ns + s
    cust, other, oid = n(f"c-{v}"), n(f"c-{v + 50}"), n(f"o-{v}")
    items = [(n(f"sku-{v}-a"), 2 + v % 3, 12 + v), (n(f"sku-{v}-b"), 1 + v % 2, 30 + 2 * v)]
    items = items[: 2 if v % 2 == 0 else 1]
    request = {"order": oid, "customer": cust,
               "items": [{"sku": s, "qty": q, "price": p} for s, q, p in items]}
    initial = State(
        kv={n(f"stock/{s[len(ns):]}"): 20 + v for s, _, _ in items},
        rows={("customers", cust): {"name": NAMES[v % len(NAMES)], "email": f"c{v}@example.com"},
              ("customers", other): {"name": NAMES[(v + 3) % len(NAMES)],
                                     "email": f"c{v + 50}@example.com"},
              **{("products", s): {"price": p} for s, _, p in items}},
        files={n("inbox/order.json"): _doc(request)})

    def draft(o: Outputs) -> Any:
        req = json.loads(o["request"]["contents"])
        total = sum(i["qty"] * i["price"] for i in req["items"])
        return {"customer": req["customer"], "items": req["items"], "total": total}

    ops = [
        Op("request", "fs.read", {"path": n("inbox/order.json")}),
        Op("draft", "kv.put", {"key": n(f"drafts/o-{v}"), "value": Calc(draft)},
           wrong=("value", "customer")),
        Op("order", "record.insert", {
            "table": "orders", "id": oid,
            "fields": {"customer_id": Ref("draft", "value.customer"),
                       "total": Ref("draft", "value.total"), "status": "confirmed"},
            "references": {"customer_id": "customers"}}),
    ]
    for k, (sku, qty, _) in enumerate(items, 1):
        ops.append(Op(f"line{k}", "record.insert", {
            "table": "line_items", "id": n(f"o-{v}/{k}"),
            "fields": {"order_id": Ref("order", "id"), "sku": sku, "qty": qty},
            "references": {"order_id": "orders", "sku": "products"}}))
    for k, (sku, qty, _) in enumerate(items, 1):
        key = n(f"stock/{sku[len(ns):]}")
        ops.append(Op(f"stock{k}", "kv.get", {"key": key}, conflict_delta=-(1 + v % 2)))
        ops.append(Op(f"take{k}", "kv.put", {"key": key, "value": _counter(f"stock{k}", -qty)}))
    lines = "".join(f"{s[len(ns):]} x{q} @ {p}\n" for s, q, p in items)
    ops += [
        Op("invoice", "fs.write", {"path": n(f"invoices/o-{v}.txt"), "contents": Fmt(
            "INVOICE {order.id}\ncustomer: {draft.value.customer}\n" + lines
            + "total: {draft.value.total}\n")}),
        Op("readback", "fs.read", {"path": Ref("invoice", "path")}),
        Op("confirm", "effect.stage", _webhook(
            {"event": "order_confirmed", "order": Ref("order", "id"),
             "customer": Ref("draft", "value.customer"), "invoice": Ref("readback", "contents")},
            n(f"o-{v}/confirmed"))),
    ]
    return Task(f"order-{v:02d}", "order", ns, initial, tuple(ops))


# ---- ticket triage ------------------------------------------------------------------------

TEAMS = ("hardware", "network", "billing")
AGENTS = {"hardware": "agent-ana", "network": "agent-bo", "billing": "agent-cy"}
SUBJECTS = ("printer on fire", "VPN drops every hour", "invoice charged twice",
            "laptop will not boot", "DNS timeouts", "refund not received")


def _triage(v: int, ns: str) -> Task:
    def n(s: str) -> str:
        return ns + s
    roster = {team: n(agent) for team, agent in AGENTS.items()}
    tickets = []
    for t in (1, 2):
        team = TEAMS[(v + t - 1) % len(TEAMS)]
        prio = ("high", "normal", "low")[(v + t) % 3]
        subject = SUBJECTS[(v + 2 * t) % len(SUBJECTS)]
        tickets.append((t, team, prio, f"subject: {subject}\nteam: {team}\npriority: {prio}\n"))
    initial = State(
        kv={n("roster"): roster, **{n(f"load/{a}"): 1 + (v + i) % 4
                                    for i, a in enumerate(AGENTS.values())}},
        rows={("agents", n(a)): {"team": team} for team, a in AGENTS.items()},
        files={n(f"tickets/T-{v}-{t}.txt"): text for t, _, _, text in tickets})

    def triage(t: int) -> Calc:
        def fn(o: Outputs) -> Any:
            fields = dict(line.split(": ", 1) for line in o[f"read{t}"]["contents"].splitlines())
            return {"assignee": o["roster"]["value"][fields["team"]], "priority": fields["priority"]}
        return Calc(fn)

    ops = [Op("roster", "kv.get", {"key": n("roster")})]
    for t, team, _, _ in tickets:
        g, load = t - 1, n(f"load/{AGENTS[team]}")
        ops += [
            Op(f"read{t}", "fs.read", {"path": n(f"tickets/T-{v}-{t}.txt")}, group=g),
            Op(f"triage{t}", "kv.put", {"key": n(f"triage/T-{v}-{t}"), "value": triage(t)},
               group=g, wrong=("value", "assignee")),
            Op(f"assign{t}", "record.insert", {
                "table": "assignments", "id": n(f"T-{v}-{t}"),
                "fields": {"agent_id": Ref(f"triage{t}", "value.assignee"),
                           "priority": Ref(f"triage{t}", "value.priority")},
                "references": {"agent_id": "agents"}}, group=g),
            Op(f"load{t}", "kv.get", {"key": load}, group=g, conflict_delta=1),
            Op(f"bump{t}", "kv.put", {"key": load, "value": _counter(f"load{t}", 1)}, group=g),
            Op(f"notify{t}", "effect.stage", _webhook(
                {"event": "ticket_assigned", "ticket": Ref(f"assign{t}", "id"),
                 "agent": Ref(f"triage{t}", "value.assignee")}, n(f"T-{v}-{t}/assigned")), group=g),
        ]
    return Task(f"triage-{v:02d}", "triage", ns, initial, tuple(ops))


# ---- stock move between warehouses -----------------------------------------------------------

def _move(v: int, ns: str) -> Task:
    def n(s: str) -> str:
        return ns + s
    sku, mid = n(f"sku-{v}"), n(f"m-{v}")
    src, dst = n(f"stock/wh-a/sku-{v}"), n(f"stock/wh-b/sku-{v}")
    request = {"move": mid, "sku": sku, "from": "wh-a", "to": "wh-b", "qty": 3 + v % 5}
    initial = State(kv={src: 40 + v, dst: 5 + v % 3},
                    rows={("products", sku): {"name": f"widget {v}"},
                          ("products", n(f"sku-{v + 50}")): {"name": f"gadget {v}"}},
                    files={n("requests/move.json"): _doc(request)})

    def draft(o: Outputs) -> Any:
        req = json.loads(o["request"]["contents"])
        return {k: req[k] for k in ("sku", "qty", "from", "to")}

    ops = (
        Op("request", "fs.read", {"path": n("requests/move.json")}),
        Op("draft", "kv.put", {"key": n(f"moves/draft-m-{v}"), "value": Calc(draft)},
           wrong=("value", "sku")),
        Op("move", "record.insert", {
            "table": "moves", "id": mid,
            "fields": {"sku": Ref("draft", "value.sku"), "qty": Ref("draft", "value.qty"),
                       "from": "wh-a", "to": "wh-b"},
            "references": {"sku": "products"}}),
        Op("src", "kv.get", {"key": src}, conflict_delta=-2),
        Op("take", "kv.put", {"key": src, "value": Calc(
            lambda o: o["src"]["value"] - o["draft"]["value"]["qty"])}),
        Op("dst", "kv.get", {"key": dst}, conflict_delta=1),
        Op("put", "kv.put", {"key": dst, "value": Calc(
            lambda o: o["dst"]["value"] + o["draft"]["value"]["qty"])}),
        Op("manifest", "fs.write", {"path": n(f"manifests/m-{v}.txt"), "contents": Fmt(
            "MOVE {move.id}\nsku: {draft.value.sku}\nqty: {draft.value.qty}\n"
            "from wh-a to wh-b\n")}),
        Op("readback", "fs.read", {"path": Ref("manifest", "path")}),
        Op("moved", "effect.stage", _webhook(
            {"event": "stock_moved", "move": Ref("move", "id"),
             "manifest": Ref("readback", "contents")}, n(f"m-{v}/moved"))),
    )
    return Task(f"move-{v:02d}", "move", ns, initial, ops)


# ---- billing ------------------------------------------------------------------------------------

def _billing(v: int, ns: str) -> Task:
    def n(s: str) -> str:
        return ns + s
    cust, plan, inv, usage = n(f"c-{v}"), n(f"plan-{v}"), n(f"inv-{v}"), n(f"usage/c-{v}")
    initial = State(
        kv={usage: 10 + v},
        rows={("plans", plan): {"unit_price": 3 + v % 4},
              ("customers", cust): {"name": NAMES[(v + 1) % len(NAMES)], "plan": plan},
              ("customers", n(f"c-{v + 50}")): {"name": NAMES[(v + 5) % len(NAMES)],
                                                "plan": plan}})

    def draft(o: Outputs) -> Any:
        units = o["usage"]["value"]
        return {"customer": o["customer"]["id"], "units": units,
                "amount": units * o["plan"]["fields"]["unit_price"]}

    ops = (
        Op("customer", "record.get", {"table": "customers", "id": cust}),
        Op("plan", "record.get", {"table": "plans", "id": Ref("customer", "fields.plan")}),
        Op("usage", "kv.get", {"key": usage}, conflict_delta=3),
        Op("draft", "kv.put", {"key": n(f"billing/draft-inv-{v}"), "value": Calc(draft)},
           wrong=("value", "customer")),
        Op("invoice", "record.insert", {
            "table": "invoices", "id": inv,
            "fields": {"customer_id": Ref("draft", "value.customer"),
                       "units": Ref("draft", "value.units"),
                       "amount": Ref("draft", "value.amount")},
            "references": {"customer_id": "customers"}}),
        Op("reset", "kv.put", {"key": usage, "value": 0}),
        Op("document", "fs.write", {"path": n(f"invoices/inv-{v}.txt"), "contents": Fmt(
            "INVOICE {invoice.id}\ncustomer: {draft.value.customer}\nunits: {draft.value.units}\n"
            "amount: {draft.value.amount}\n")}),
        Op("readback", "fs.read", {"path": Ref("document", "path")}),
        Op("email", "effect.stage", _webhook(
            {"event": "invoice_issued", "invoice": Ref("invoice", "id"),
             "amount": Ref("draft", "value.amount"), "document": Ref("readback", "contents")},
            n(f"inv-{v}/issued"))),
    )
    return Task(f"billing-{v:02d}", "billing", ns, initial, ops)


# ---- refund ---------------------------------------------------------------------------------------

def _refund(v: int, ns: str) -> Task:
    def n(s: str) -> str:
        return ns + s
    cust, oid, rid, credit = n(f"c-{v}"), n(f"o-{v}"), n(f"r-{v}"), n(f"credit/c-{v}")
    request = {"refund": rid, "order": oid, "amount": 5 + v % 7, "reason": "arrived damaged"}
    initial = State(
        kv={credit: v % 3},
        rows={("customers", cust): {"name": NAMES[(v + 2) % len(NAMES)]},
              ("orders", oid): {"customer_id": cust, "total": 40 + v},
              ("orders", n(f"o-{v + 50}")): {"customer_id": cust, "total": 15}},
        files={n("requests/refund.json"): _doc(request)})

    def draft(o: Outputs) -> Any:
        req = json.loads(o["request"]["contents"])
        return {"order": req["order"], "amount": req["amount"], "reason": req["reason"]}

    ops = (
        Op("request", "fs.read", {"path": n("requests/refund.json")}),
        Op("draft", "kv.put", {"key": n(f"refunds/draft-r-{v}"), "value": Calc(draft)},
           wrong=("value", "order")),
        Op("order", "record.get", {"table": "orders", "id": Ref("draft", "value.order")}),
        Op("refund", "record.insert", {
            "table": "refunds", "id": rid,
            "fields": {"order_id": Ref("order", "id"),
                       "customer_id": Ref("order", "fields.customer_id"),
                       "amount": Ref("draft", "value.amount")},
            "references": {"order_id": "orders", "customer_id": "customers"}}),
        Op("finance", "effect.stage", _webhook(
            {"event": "refund_approved", "refund": Ref("refund", "id"),
             "amount": Ref("draft", "value.amount")}, n(f"r-{v}/finance"))),
        Op("credit", "kv.get", {"key": credit}, conflict_delta=4),
        Op("add", "kv.put", {"key": credit, "value": Calc(
            lambda o: o["credit"]["value"] + o["draft"]["value"]["amount"])}),
        Op("receipt", "fs.write", {"path": n(f"receipts/r-{v}.txt"), "contents": Fmt(
            "REFUND {refund.id}\norder: {order.id}\namount: {draft.value.amount}\n"
            "reason: {draft.value.reason}\n")}),
        Op("readback", "fs.read", {"path": Ref("receipt", "path")}),
        Op("customer", "effect.stage", _webhook(
            {"event": "refund_issued", "refund": Ref("refund", "id"),
             "receipt": Ref("readback", "contents")}, n(f"r-{v}/customer"))),
    )
    return Task(f"refund-{v:02d}", "refund", ns, initial, ops)


# ---- onboarding --------------------------------------------------------------------------------------

def _onboard(v: int, ns: str) -> Task:
    def n(s: str) -> str:
        return ns + s
    plan, cust, acct, seats = n(f"plan-{v}"), n(f"cust-{v}"), n(f"acct-{v}"), n(f"seats/plan-{v}")
    signup = {"name": NAMES[(v + 4) % len(NAMES)], "email": f"new{v}@example.com", "plan": plan}
    initial = State(kv={seats: 2 + v % 5},
                    rows={("plans", plan): {"seats": 10},
                          ("plans", n(f"plan-{v + 50}")): {"seats": 3}},
                    files={n("signups/new.json"): _doc(signup)})
    ops = (
        Op("request", "fs.read", {"path": n("signups/new.json")}),
        Op("draft", "kv.put", {"key": n(f"signup/draft-{v}"), "value": Calc(_read_json("request"))},
           wrong=("value", "plan")),
        Op("customer", "record.insert", {
            "table": "customers", "id": cust,
            "fields": {"name": Ref("draft", "value.name"), "plan": Ref("draft", "value.plan")},
            "references": {"plan": "plans"}}),
        Op("account", "record.insert", {
            "table": "accounts", "id": acct,
            "fields": {"customer_id": Ref("customer", "id"), "email": Ref("draft", "value.email")},
            "references": {"customer_id": "customers"}}),
        Op("welcome", "effect.stage", _webhook(
            {"event": "welcome", "customer": Ref("customer", "id"),
             "email": Ref("draft", "value.email")}, n(f"cust-{v}/welcome"))),
        Op("seats", "kv.get", {"key": seats}, conflict_delta=1),
        Op("take", "kv.put", {"key": seats, "value": _counter("seats", 1)}),
        Op("document", "fs.write", {"path": n(f"welcome/cust-{v}.md"), "contents": Fmt(
            "# Welcome {draft.value.name}\nplan: {draft.value.plan}\naccount: {account.id}\n")}),
        Op("readback", "fs.read", {"path": Ref("document", "path")}),
        Op("crm", "kv.put", {"key": n(f"crm/cust-{v}"), "value": {
            "onboarded": True, "account": Ref("account", "id"),
            "welcome": Ref("readback", "contents")}}),
    )
    return Task(f"onboard-{v:02d}", "onboard", ns, initial, ops)


_BUILDERS: dict[str, Callable[[int, str], Task]] = {
    "order": _order, "triage": _triage, "move": _move, "billing": _billing,
    "refund": _refund, "onboard": _onboard,
}


def build(index: int, ns: str = "") -> Task:
    """Task number `index` of the suite, with every name inside namespace `ns`."""
    if index < 0:
        raise ValueError("task index must be >= 0")
    return _BUILDERS[FAMILIES[index % len(FAMILIES)]](index // len(FAMILIES), ns)


def suite(n: int, ns: str = "") -> list[Task]:
    """The first `n` tasks (all in namespace `ns`; for schedules and checks)."""
    return [build(i, ns) for i in range(n)]
