"""validate: required fields (memo-031) and sanity of untrusted metadata (LNMP section 9.1)."""

from __future__ import annotations

from app.agents.base import Message, Stage
from app.envelope.validation import SanityPolicy, required_problems, sanity_problems
from app.errors import ValidationError
from app.topology import ValidateStage


class Validate(Stage):
    name = "validate"

    def __init__(self, settings: ValidateStage) -> None:
        self.policy = SanityPolicy(max_future_skew_ms=settings.max_future_skew_s * 1000,
                                   max_age_ms=settings.max_age_days * 86_400_000,
                                   max_id_length=settings.max_id_length)

    def process(self, msg: Message) -> None:
        env = msg.env
        # `msg.scanned` is set only for an envelope whose required fields normalize already
        # checked and found complete (and nothing since could unset one): not again here.
        problems = sanity_problems(env, policy=self.policy)
        if msg.scanned is None:
            problems = required_problems(env) + problems
        if problems:
            raise ValidationError(problems)
