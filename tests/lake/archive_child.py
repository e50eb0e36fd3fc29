"""Child process for the SIGKILL test: archives records forever-ish with tiny rolls, so a
kill lands at a random point, maybe in the middle of a roll. Not a test module."""

import sys

from app.lake.archive import ArchiveSink
from tests.lake.conftest import make_traffic

if __name__ == "__main__":
    root, n = sys.argv[1], int(sys.argv[2])
    traffic = make_traffic(n, dup_every=0)
    sink = ArchiveSink(root, writer_id="child", max_file_bytes=8_000, max_file_age_s=3600)
    sink.open()
    print("ready", flush=True)
    for rec in traffic.records:
        sink.write([rec])
    sink.flush()
    print("done", flush=True)
