"""The operator console in headless Chromium (Selenium + Debian's chromium-driver), on the
real embedded broker, a real worker with its management API, and a real registry.

The flow an operator follows: producers send confidential data unencrypted, the policy stage
dead-letters it (`policy_violation`, tests/worker/replay.py); the policy is fixed and the worker
restarted on the same group. In the browser: log in as a reader, see the pipeline (state, rates,
lag, DLQ depth and DLQ by reason), open its DLQ, find the record whose payload holds a
``<script>`` (rendered as text, never run), see that a reader cannot replay it; log in as an
admin, replay it, follow the link to `.v3` and see it there - decoded, with the identity its
token proved - and check `.v3` independently with a Kafka read. Then the subjects (search, the
real verdict under BACKWARD and FULL, pretty schemas, the diff) and the governance page.
Screenshots of every step are saved in the test's tmp dir (``console-*.png``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.broker.embedded import EmbeddedBroker, find_free_port
from app.console import create_app
from app.demo.runner import read_all
from app.envelope import decode
from app.observability.metrics import PipelineMetrics
from app.security.devkeys import DevKeys
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from tests.console.support import BACKWARD_SUBJECT, FULL_SUBJECT, XSS, console_settings, registry_server, serve
from tests.support import ADMIN_CLEARED, USERS, write_users_file
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline
from tests.worker.replay import authenticated_messages, fixed_topology


class Flow:
    """The browser steps (Selenium blocks: they run in a thread, the worker on the event loop)."""

    def __init__(self, drv: Any, url: str, shots: Path) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.drv, self.url, self.shots = drv, url, shots
        self.wait = WebDriverWait(drv, 30)

    def shot(self, name: str) -> Path:
        path = self.shots / f"console-{name}.png"
        self.drv.save_screenshot(str(path))
        return path

    def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec

        return str(self.wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, css))).text)

    def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec

        self.wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, css))).click()

    def no_alert(self) -> None:
        from selenium.common.exceptions import NoAlertPresentException

        try:
            self.drv.switch_to.alert  # noqa: B018 - raises when there is none
        except NoAlertPresentException:
            return
        raise AssertionError("a script from the data ran")

    def login(self, user: str, path: str = "/") -> None:
        from selenium.webdriver.common.by import By

        self.drv.delete_all_cookies()
        self.drv.get(self.url + path)
        self.wait.until(lambda d: "/login" in d.current_url)
        self.drv.find_element(By.ID, "user").send_keys(user)
        self.drv.find_element(By.ID, "password").send_keys(USERS[user][0])
        self.click("#login")
        self.wait.until(lambda d: "/login" not in d.current_url)
        assert self.text("#who") == user


def _browse(flow: Flow, name: str, src: str, xss_ref: str, partition: int) -> dict[str, Any]:
    """Everything in the browser; returns what the pages said, for the checks on Kafka."""
    from selenium.webdriver.common.by import By

    out: dict[str, Any] = {}
    # Not logged in: the log-in page, whatever was asked for.
    flow.drv.get(flow.url + "/subjects")
    flow.wait.until(lambda d: "/login" in d.current_url)
    flow.shot("01-login")
    flow.login("reader")
    # The pipelines page: state, rates, lag, DLQ depth and DLQ by reason.
    card = flow.text(f'.pipeline[data-pipeline="{name}"]')
    assert "RUNNING" in card and "lag (group)" in card and "in / s" in card, card
    assert flow.text(f'.pipeline[data-pipeline="{name}"] .dlq-depth') == "5"  # four policy violations and the bad token
    reasons = flow.text(f'.pipeline[data-pipeline="{name}"] table.reasons')
    assert "none" not in reasons, reasons  # the fixed worker dead-lettered the bad token
    flow.shot("02-pipelines")
    # Its DLQ: four policy violations from before the fix, and the bad token's.
    flow.click(f'a[id="open-dlq-{name}"]')
    flow.text("#dlq-table")
    chips = flow.text(".chips")
    assert "policy_violation 4" in chips, chips
    flow.click('.chip[data-reason="policy_violation"]')
    flow.wait.until(lambda d: "reason=policy_violation" in d.current_url)
    rows = [r.get_attribute("data-ref") for r in flow.drv.find_elements(By.CSS_SELECTOR, "tr.dlq-row")]
    assert len(rows) == 4 and xss_ref in rows, rows
    flow.shot("03-dlq")
    # The record: its producer labelled it confidential (its data-classification header), above
    # the reader's clearance (the default, internal): where it failed, not what it holds
    # (app/console/clearance.py); a reader may not replay.
    flow.click(f'tr.dlq-row[data-ref="{xss_ref}"] a.record-link')
    withheld = flow.text("#record-withheld")
    assert "confidential" in withheld and "internal" in withheld, withheld
    assert not flow.drv.find_elements(By.ID, "record-value") and "o-xss" not in flow.drv.page_source
    assert flow.text("#record-reason") == "policy_violation"
    assert "Replaying needs the admin role" in flow.text("#replay-needs-admin")
    record_url = flow.drv.current_url
    flow.shot("04-record-reader")
    # An admin cleared for it sees it decoded, redacted, the <script> as text; replays it and
    # follows it to .v3.
    flow.login("admin", record_url.removeprefix(flow.url))
    value = flow.text("#record-value")
    assert XSS in value and '"note"' in value, value
    flow.no_alert()
    assert "Bearer" not in flow.text("#record-headers")
    flow.shot("05-record-admin")
    flow.click("#replay")
    outcome = flow.text("#replay-outcome")
    assert outcome.startswith(f"Replayed {xss_ref} (policy_violation) to {src} partition {partition} offset"), outcome
    out["replayed_offset"] = int(outcome.rstrip(".").rsplit(" ", 1)[-1])
    flow.shot("06-replayed")
    flow.click("#trace-link")
    found = flow.text("#trace-found")  # the page reloads itself until the worker has emitted it
    assert found.startswith(f"On {src}.v3 partition "), found
    trace = flow.text("#trace-value")
    assert XSS in trace and "publisher-xss" in trace, trace
    flow.no_alert()
    out["v3_text"] = trace
    flow.shot("07-on-v3")
    # The DLQ now says it was replayed, and by whom.
    flow.drv.get(f"{flow.url}/pipelines/{name}/dlq?reason=policy_violation")
    assert "console:admin" in flow.text(f'tr.dlq-row[data-ref="{xss_ref}"]')
    # Subjects: search, configured compatibility, a real verdict per pair, pretty schema, diff.
    flow.drv.get(flow.url + "/subjects")
    flow.drv.find_element(By.ID, "subject-search").send_keys("full")
    flow.wait.until(lambda d: not d.find_element(By.CSS_SELECTOR, f'tr[data-subject="{BACKWARD_SUBJECT}"]')
                    .is_displayed())
    flow.shot("08-subjects-search")
    flow.click(f'tr[data-subject="{FULL_SUBJECT}"] a')
    assert flow.text("#verdict") == "breaking (FULL)"
    assert flow.text("#compat-mode") == "FULL"
    assert '\n  "name": "Order",\n' in flow.text("#schema") and XSS in flow.text("#schema")
    assert "coupon" in flow.text("#diff")
    flow.no_alert()
    flow.shot("09-subject-full")
    flow.drv.get(f"{flow.url}/subjects/{BACKWARD_SUBJECT}")
    assert flow.text("#verdict") == "compatible (BACKWARD)"
    flow.shot("10-subject-backward")
    flow.drv.get(flow.url + "/governance")
    assert BACKWARD_SUBJECT in flow.text("#policies") and "FULL" in flow.text("#policies")
    flow.text("#pii-audit")
    flow.shot("11-governance")
    flow.drv.get(flow.url + "/audit")
    assert "tests" in flow.text("#audit")
    flow.shot("12-audit")
    return out


@pytest.mark.timeout(300)
async def test_console_login_find_replay_and_see_on_v3(broker: EmbeddedBroker, tmp_path: Path, dev_keys: DevKeys,
                                                       browser: Any) -> None:
    users_file = write_users_file(tmp_path / "users.yaml", clearances=ADMIN_CLEARED)
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    group = f"console-{uuid.uuid4().hex[:8]}"
    messages = [(v, h) for v, h, _ in authenticated_messages(src, dev_keys, 3)]
    token = dev_keys.mint_token("publisher-xss", team="commerce")
    messages.append((json.dumps({"order_id": "o-xss", "note": XSS}).encode(),
                     [("content-type", b"application/json"), ("data-classification", b"confidential"),
                      ("Authorization", f"Bearer {token}".encode())]))
    # Before the fix: every message is dead-lettered as a policy violation.
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", app_id=group) as p:
        for value, headers in messages:
            await p.send(value, headers=headers)
        await p.wait_read(len(messages))
    assert p.pipeline.summary()["dlq_reasons"] == {"policy_violation": 4}
    dlq = (await read_all(broker.bootstrap, {src + ".dlq": 2}, expected_total=4, timeout=30))[src + ".dlq"]
    xss = next(r for r in dlq if XSS.encode() in r.value)
    xss_ref, xss_partition = f"{xss.partition}@{xss.offset}", int(dict(xss.headers)["prism.errors.partition"])

    # The fix rolled out: same group, policy changed, management API behind the users file.
    fixed = fixed_topology(topo, tmp_path / "fixed")
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(users_file),
                                              "PRISM_ADMIN_ALLOW_ANONYMOUS": "none"})
    port = find_free_port()
    async with RunningPipeline(fixed, broker.bootstrap, tmp_path / "w", app_id=group, web_port=port,
                               observe=Observer(metrics=PipelineMetrics(), management=management)) as p2:
        await p2.send(b'{"order_id": "o-bad"}', headers=[("Authorization", b"Bearer not-a-token")])
        await p2.wait_read(1)
        with registry_server(tmp_path, users_file) as (registry_url, _):
            settings = console_settings(users_file, registry_url=registry_url,
                                        worker_urls=(f"http://127.0.0.1:{port}",), bootstrap=broker.bootstrap)
            with serve(create_app(settings)) as console_url:
                flow = Flow(browser, console_url, tmp_path)
                seen = await asyncio.to_thread(_browse, flow, fixed.name, src, xss_ref, xss_partition)
        await p2.wait_read(2)  # the bad token, and the replayed record
        v3 = (await read_all(broker.bootstrap, {src + ".v3": 2}, expected_total=1, timeout=30))[src + ".v3"]
    # Independently of the console: the replayed record is on .v3 once, from the offset the page named.
    marker = f"{src}/{xss_partition}/{seen['replayed_offset']}".encode()
    on_v3 = [r for r in v3 if dict(r.headers).get("prism-source") == marker]
    assert len(on_v3) == 1 and len(v3) == 1
    env = decode(on_v3[0].value)
    assert env.security.publisher_id == "publisher-xss" and XSS.encode() in env.payload_bytes()
    assert sorted(p.name for p in tmp_path.glob("console-*.png")) == [
        "console-01-login.png", "console-02-pipelines.png", "console-03-dlq.png", "console-04-record-reader.png",
        "console-05-record-admin.png", "console-06-replayed.png", "console-07-on-v3.png",
        "console-08-subjects-search.png", "console-09-subject-full.png", "console-10-subject-backward.png",
        "console-11-governance.png", "console-12-audit.png"]
    if os.environ.get("PRISM_CONSOLE_SHOTS"):  # keep them for a person to look at
        dest = Path(os.environ["PRISM_CONSOLE_SHOTS"])
        dest.mkdir(parents=True, exist_ok=True)
        for png in tmp_path.glob("console-*.png"):
            shutil.copy(png, dest / png.name)
