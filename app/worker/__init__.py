"""The Faust worker layer: the tuned app factory and the embedded-broker consumer fixes.

* :mod:`app.worker.faust_app` - ``make_app``, ``PrismWorker``, ``InProcessWorker``, ``WorkerProcess``
  and the ``python -m app.worker.faust_app package.module:attr`` entry point.
* :mod:`app.worker.offsets` - fetch-derived end offsets for the embedded broker (ListOffsets bug).
"""
