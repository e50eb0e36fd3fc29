"""verify_signature: check the producer's signature over the bytes it sent.

The signature is verified on the *received* bytes (`msg.value`), never on a re-encoding,
so it holds across languages (docs/signing.md). Inputs that are not Prism envelopes
(legacy shapes) cannot carry a Prism signature: with policy `required` they are rejected,
with `optional` they pass as unsigned. Keys are per namespace: a key the keyring
scopes to namespace A never verifies an envelope claiming B (`key_not_allowed_for_namespace`),
nor does a key the topology's `producers:` does not declare for B.

Scope: signatures must use scope v2 (the whole envelope except signature and token), or
the pair or batch scope a Prism worker writes its `.v2`/`.v3` copies with (so one worker can
read another's output; a batch's signature is verified once, docs/signing.md), unless the topology sets `accept_legacy_scope`; a legacy-scope one is rejected with its
own reason (`legacy_signature_scope`), an unknown scope with `unsupported_signature_scope`.
Every envelope input, signed or not, must also be unambiguous (`ambiguous_envelope`): a
second security record with an empty signature would otherwise make a signed envelope
look unsigned to the merged parse this stage reads.
"""

from __future__ import annotations

from app.agents.base import Message, Stage
from app.errors import SignatureError
from app.security.producers import ProducerBindings, check_keyring_scope
from app.security.signing import SigningKeyring, check_unambiguous, verify
from app.topology import VerifySignatureStage


class VerifySignature(Stage):
    name = "verify_signature"

    def __init__(self, settings: VerifySignatureStage, *, keyring: SigningKeyring,
                 producers: ProducerBindings | None = None) -> None:
        self.policy = settings.policy
        self.accept_legacy_scope = settings.accept_legacy_scope
        self.keyring = keyring
        self.producers = producers

    def process(self, msg: Message) -> None:
        if self.policy == "off":
            return
        env = msg.env
        if msg.original_is_envelope:
            # normalize's walk of these very bytes, if it made one (Message.scanned): every
            # check below runs on it exactly as on a fresh walk
            scanned = msg.scanned
            value = msg.value
            records, layout = (scanned[1], scanned[2]) if scanned is not None and scanned[0] is value else (None, None)
            header = env.header
            sec = header.security  # an absent context reads as the empty default: no signature
            if sec.signature:
                namespace = header.metadata.namespace
                check_keyring_scope(self.keyring, sec.signature_key_id, namespace)
                # with normalize's walk, `sec` is a parse of these very bytes' header: the record
                # is not parsed again (`verify`'s `security`)
                msg.signature = verify(value, self.keyring.keys_for(namespace),
                                       accept_legacy_scope=self.accept_legacy_scope, layout=layout, records=records,
                                       security=sec if records is not None else None)
                if self.producers is not None:  # the topology's `producers:` key_ids (app/security/producers.py)
                    self.producers.check_key(msg.signature.key_id, namespace, msg.topic)
                return
            check_unambiguous(value, layout=layout, records=records)
        if self.policy == "required":
            what = "envelope is not signed" if msg.original_is_envelope else f"{msg.shape} input carries no signature"
            raise SignatureError(what, path="security.signature",
                                 hint="sign envelopes in the producer (Prism SDK signing_key), "
                                      "or set verify_signature.policy to optional")
