"""Pipeline stages, one concern per module, in the order a topology runs them:

normalize -> validate -> authenticate -> verify_signature -> policy -> dedup -> enrich
-> publish (dual-publish + archive tap); any failure -> dlq.

Each stage is a plain class with a synchronous `process(msg)` that raises a `PrismError`
to reject: readable in one sitting and testable without a broker. `chain.Pipeline`
strings them together; `app.worker` runs the pipeline inside Faust agents.
"""
