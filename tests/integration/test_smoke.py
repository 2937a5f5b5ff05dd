"""A transaction end to end across two replicas: what one replica wrote, the other reads
and commits; the committed value is visible to a new transaction."""

from support.service import Agent


def test_a_transaction_runs_end_to_end_across_two_replicas(a, b, uniq):
    agent = Agent(a)
    assert agent.next == 1
    assert agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1}) == {"key": f"k-{uniq}", "value": 1}
    assert agent.ok("kv.get", {"key": f"k-{uniq}"}, stub=b) == {"key": f"k-{uniq}", "value": 1}
    resp = agent.commit()
    assert (resp.committed, resp.steps_committed) == (True, 2)
    assert Agent(b).ok("kv.get", {"key": f"k-{uniq}"})["value"] == 1
