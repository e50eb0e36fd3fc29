"""The version string the SDK writes into every envelope it publishes
(`metadata.producer_sdk_version`, memo-031 migration tracking).

Why it exists: a sunset (`outputs.migration`, docs/topologies.md) can only end when every
producer runs an SDK that publishes what the successor topic needs. The version each envelope
carries lets the worker count outputs per SDK version (`prism_producer_sdk_outputs_total`) and
`prism migrate status` show adoption over recent source records - without asking every team.

The format is `<sdk>/<version>`: the SDK's language-neutral name and the installed package
version, so SDKs in other languages can report theirs next to this one without colliding.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

#: The name of this SDK in `producer_sdk_version` (other SDKs use their own name).
SDK_NAME = "prism-python"


#: The distribution this code was installed from, by top-level package: the worker's tree
#: (`app`, distribution prism-envelope) or the client distribution built from the same files
#: (`prism_client`, distribution prism-client; clients/python). Both carry the same version.
_DISTRIBUTIONS = {"app": "prism-envelope", "prism_client": "prism-client"}


def _package_version() -> str:
    try:
        return version(_DISTRIBUTIONS.get(__name__.partition(".")[0], "prism-envelope"))
    except PackageNotFoundError:  # run from a source tree without `pip install -e .`
        return "0+unknown"


#: What every envelope this SDK builds carries in `metadata.producer_sdk_version`.
SDK_VERSION = f"{SDK_NAME}/{_package_version()}"

#: What a `producer_sdk_version` must look like to be shown or become a metric label. The
#: producer writes it, so anything else - a planted token has no `/` - is reported as "invalid".
SDK_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}/[0-9][A-Za-z0-9._+-]{0,31}")


def version_label(value: str) -> str:
    """A `producer_sdk_version` as it may be reported: "none" when empty (no Prism SDK stamped
    it), "invalid" when not `<name>/<version>`, else the value itself."""
    if not value:
        return "none"
    return value if SDK_VERSION_PATTERN.fullmatch(value) else "invalid"


__all__ = ["SDK_NAME", "SDK_VERSION", "SDK_VERSION_PATTERN", "version_label"]
