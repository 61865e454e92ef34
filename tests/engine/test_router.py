"""The replicas' router beyond its docstrings' examples (those run in tests/test_docs.py: rendezvous
placement, which GPU a replica takes, which jobs ride short passes): documents kept where they went, the
load bound."""

from quail.engine.runtime import replicas


def test_a_document_stays_on_its_replica_until_the_load_bound_moves_it():
    router = replicas.Router(3)
    [home] = router.route([b"doc"], [10], {0, 1, 2})
    router.done(home, 10)
    assert router.route([b"doc"], [10], {0, 1, 2}) == [home]
    router.queued[home] += 1000  # its replica is busy: the document moves to the least loaded, and stays there
    [moved] = router.route([b"doc"], [10], {0, 1, 2})
    assert moved != home and router.placed[b"doc"] == moved
