"""Pipeline stages, one concern per module, in the order a topology runs them:

normalize -> validate -> authenticate -> verify_signature -> identity -> policy -> dedup
-> enrich -> publish (dual-publish + archive tap); any failure -> dlq. `identity` is not a
topology stage: the worker always inserts it after the verifying stages (identity.py).

Each stage is a plain class with a synchronous `process(msg)` that raises a `PrismError`
to reject: readable in one sitting and testable without a broker. `chain.Pipeline`
strings them together; `app.worker` runs the pipeline inside Faust agents.
"""
