"""Identity spoofing, end to end through the real worker on the embedded broker: a producer
with no credential claims to be the order service (`svc-orders`, team `commerce`) through every
input shape that can state a publisher (spoofs.EVERY_SHAPE), and through a signature by a key
bound to no publisher. The worker signs whatever it emits, so what matters is what its outputs
*state*: for every attack record, in `.v2` and in `.v3`, under a valid worker signature -

* no publisher identity (`publisher_id` and `publisher_team` absent),
* `prism.identity.method: none`,
* the claim visible only as `prism.claimed.publisher_id` / `prism.claimed.publisher_team`,
* security fields that differ from those of the genuinely authenticated control, and no
  legacy header on the output record repeating the claim.

Also: a producer that pre-states the worker's own extensions (`prism.identity.method: token`)
gets them replaced, and an anonymous Kafka header `data-classification: public` on a source
whose floor is `internal` comes out `internal` (the claim kept as
`prism.claimed.data_classification`). Controls: a token and a key bound to svc-orders each come
out as svc-orders with their method, so a worker that stripped every identity could not pass.
"""

from __future__ import annotations

import json
from typing import Any

from app.agents.identity import (
    CLAIMED_CLASSIFICATION,
    CLAIMED_PUBLISHER_ID,
    CLAIMED_PUBLISHER_TEAM,
    KEY_ID_EXTENSION,
    METHOD_EXTENSION,
)
from app.envelope import Envelope, Layout, decode, encode, new_envelope
from app.security.signing import SigningKey, VerificationKeys, sign, verify
from tests.security.adversarial.conftest import Adversary, Attack
from tests.security.adversarial.spoofs import EVERY_SHAPE, PUBLISHER, TEAM

SHADOW_SECRET = b"shadow-unbound-key-0123456789xyz"
CLAIM_HEADERS = {"publisher-id", "publisher-team", "x-publisher-id", "x-publisher-team", "data-classification",
                 "x-data-classification"}


def _ext(env: Envelope, key: str) -> str | None:
    raw = env.extensions.get(key)
    return None if raw is None else raw.decode()


def _security(env: Envelope) -> tuple[Any, ...]:
    """What a consumer reads to decide who sent a message and how to treat it."""
    sec = env.security
    assert sec is not None
    return (sec.publisher_id, sec.publisher_team, sec.data_classification, _ext(env, METHOD_EXTENSION))


async def test_a_spoofed_identity_is_never_stated_as_verified(adversary: Adversary) -> None:
    keys = adversary.keys
    keyring = adversary.keyring([{"id": "shadow-key", "secret": SHADOW_SECRET}])

    def edit(doc: dict[str, Any]) -> None:
        doc["sources"][0]["classification_floor"] = "internal"
        for st in doc["stages"]:
            if "verify_signature" in st:
                st["verify_signature"]["keyring"] = str(keyring)
        doc["producers"][1]["key_ids"] = ["shadow-key"]  # declared, so the key verifies; bound to no one
        # the LNMP spoofs come from a known LNMP service (known_sources is on in the shipped topology)
        lnmp = doc["sources"][0].setdefault("lnmp", {})
        lnmp["known_sources"] = [*lnmp.get("known_sources", []), PUBLISHER]

    topo = adversary.topology(edit)
    src = topo.sources[0].topic
    token = keys.mint_token(PUBLISHER, team=TEAM)

    def order(**kw: Any) -> Envelope:
        env = new_envelope(src, {"order_id": "o-1", "total": 10.0}, namespace="order-events", **kw)
        env.ensure_security().data_classification = "internal"
        return env

    shadow_signed = order()
    shadow_signed.security.publisher_id, shadow_signed.security.publisher_team = PUBLISHER, TEAM
    pre_stated = order()
    pre_stated.security.publisher_id, pre_stated.security.publisher_team = PUBLISHER, TEAM
    pre_stated.extensions[METHOD_EXTENSION] = b"token"
    pre_stated.extensions[KEY_ID_EXTENSION] = b"dev-producer-1"
    pre_stated.extensions[CLAIMED_PUBLISHER_ID] = b"nobody"
    token_control = order()
    token_control.security.auth_token = token

    spoofs = [Attack(s.label, *s.build(src)) for s in EVERY_SHAPE]
    extra = [
        Attack("signed-by-unbound-key", sign(shadow_signed, SigningKey.hmac_sha256("shadow-key", SHADOW_SECRET))),
        Attack("pre-stated-method", encode(pre_stated)),
        Attack("anonymous-public-header", b'{"order_id": "o-2"}',
               [("content-type", b"application/json"), ("data-classification", b"public"),
                ("publisher-id", PUBLISHER.encode()), ("publisher-team", TEAM.encode())]),
    ]
    controls = [
        Attack("control-token", encode(token_control)),
        Attack("control-key", sign(order(), keys.keyring.signing["dev-producer-1"])),
    ]
    landed = await adversary.run(topo, [*spoofs, *extra, *controls])

    worker = VerificationKeys.of([keys.keyring.verify_all.keys["prism-worker-1"]])
    outputs: dict[tuple[str, str], Envelope] = {}
    for layout, lay in (("v2", Layout.DRAFT), ("v3", Layout.REVIEWED)):
        for rec in landed.on(layout):
            verify(rec.value, worker, layout=lay)  # what a consumer trusting the worker checks
            outputs[((rec.key or b"").decode(), layout)] = decode(rec.value)
            assert not {k.lower() for k, _ in rec.headers} & CLAIM_HEADERS, rec.headers

    # --- the controls: verified identities come out as such -------------------------------------
    for label, method in (("control-token", "token"), ("control-key", "key")):
        assert landed.where(label) == "v3"
        for layout in ("v2", "v3"):
            assert _security(outputs[(label, layout)]) == (PUBLISHER, TEAM, "internal", method), (label, layout)
    genuine = _security(outputs[("control-token", "v3")])

    # --- every spoof: emitted, signed by the worker, stating no verified identity ----------------
    for attack in [*spoofs, *extra]:
        assert landed.where(attack.label) == "v3", attack.label
        for layout in ("v2", "v3"):
            env = outputs[(attack.label, layout)]
            sec = env.security
            assert sec is not None
            where = (attack.label, layout)
            assert not sec.HasField("publisher_id") and not sec.HasField("publisher_team"), where
            assert _ext(env, METHOD_EXTENSION) == "none", where
            assert _ext(env, KEY_ID_EXTENSION) is None, where
            assert _ext(env, CLAIMED_PUBLISHER_ID) == PUBLISHER, where
            assert _security(env) != genuine, where
            claims_team = next((s.claims_team for s in EVERY_SHAPE if s.label == attack.label), True)
            assert _ext(env, CLAIMED_PUBLISHER_TEAM) == (TEAM if claims_team else None), where

    # --- the anonymous downgrade: raised to the source's floor, the claim kept ------------------
    for layout in ("v2", "v3"):
        env = outputs[("anonymous-public-header", layout)]
        assert env.security.data_classification == "internal"
        assert _ext(env, CLAIMED_CLASSIFICATION) == "public"
    assert landed.summary["dlq"] == 0, landed.summary
    assert len(landed.on("v3")) == len(spoofs) + len(extra) + len(controls)
    json.dumps(landed.summary)  # the summary stays plain data
