"""Tools users run to test their own setup; shipped with the package, used by our tests too.

- ``stub_provider``: the fault-injecting reference provider (``delivery stub-provider``,
  ``python -m delivery.testing.stub_provider``; ``StubServer`` in-process, ``StubClient``
  for one running elsewhere).
- ``demo``: ``delivery demo``, the whole pipeline on the embedded default with faults on.
- ``processes``: Celery worker, beat and the stub as real subprocesses.
- ``fill``: a large outbox, bulk-loaded, for plan tests and benchmarks.
- ``without_otel``: imported first, a process as without the ``[otel]`` extra (tests, bench).

Nothing in the pipeline imports this room. May import anything of ``delivery`` except the CLI;
``stub_provider`` imports nothing of ``delivery`` (it stands for somebody else's service).
"""
