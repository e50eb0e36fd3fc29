"""verify_signature: check the producer's signature over the bytes it sent.

The signature is verified on the *received* bytes (`msg.value`), never on a re-encoding,
so it holds across languages (see `app.security.signing`). Inputs that are not Prism
envelopes (legacy shapes) cannot carry a Prism signature: with policy `required` they are
rejected, with `optional` they pass as unsigned. Keys are per namespace: a key the keyring
scopes to namespace A never verifies an envelope claiming B (`key_not_allowed_for_namespace`),
nor does a key the topology's `producers:` does not declare for B.
"""

from __future__ import annotations

from app.agents.base import Message, Stage
from app.errors import SignatureError
from app.security.producers import ProducerBindings, check_keyring_scope
from app.security.signing import SigningKeyring, verify
from app.topology import VerifySignatureStage


class VerifySignature(Stage):
    name = "verify_signature"

    def __init__(self, settings: VerifySignatureStage, *, keyring: SigningKeyring,
                 producers: ProducerBindings | None = None) -> None:
        self.policy = settings.policy
        self.keyring = keyring
        self.producers = producers

    def process(self, msg: Message) -> None:
        if self.policy == "off":
            return
        env = msg.env
        sec = env.security
        signed = msg.original_is_envelope and sec is not None and bool(sec.signature)
        if not signed:
            if self.policy == "required":
                what = "envelope is not signed" if msg.original_is_envelope else f"{msg.shape} input carries no signature"
                raise SignatureError(what, path="security.signature",
                                     hint="sign envelopes in the producer (Prism SDK signing_key), "
                                          "or set verify_signature.policy to optional")
            return
        check_keyring_scope(self.keyring, sec.signature_key_id, env.namespace)  # type: ignore[union-attr]
        msg.signature = verify(msg.value, self.keyring.keys_for(env.namespace))
        if self.producers is not None:  # the topology's `producers:` key_ids (app/security/producers.py)
            self.producers.check_key(msg.signature.key_id, env.namespace, msg.topic)
