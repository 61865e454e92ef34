"""The replicas' router as its docstrings say (rendezvous placement, documents kept where they went, the
load bound), and the small rules beside it: which GPU a replica takes, which jobs ride short passes."""

import doctest

import pytest

from quail.engine.runtime import loading, replicas, scheduler


@pytest.mark.parametrize("function", [replicas.Router, loading.replica_device, scheduler.pass_tokens],
                         ids=lambda f: f.__qualname__)
def test_the_rule_as_documented(function):
    runner = doctest.DocTestRunner()
    module = vars(__import__(function.__module__, fromlist=["_"]))
    for example in doctest.DocTestFinder().find(function, function.__qualname__, globs=dict(module)):
        runner.run(example)
    assert runner.tries and not runner.failures


def test_a_document_stays_on_its_replica_until_the_load_bound_moves_it():
    router = replicas.Router(3)
    [home] = router.route([b"doc"], [10], {0, 1, 2})
    router.done(home, 10)
    assert router.route([b"doc"], [10], {0, 1, 2}) == [home]
    router.queued[home] += 1000  # its replica is busy: the document moves to the least loaded, and stays there
    [moved] = router.route([b"doc"], [10], {0, 1, 2})
    assert moved != home and router.placed[b"doc"] == moved
