"""`modelforge local up` with the emulator's request lock removed and a tiny GIL switch interval.

Only for the test that proves the enrollment race test can fail: moto alone checks a
condition and writes in separate steps, so concurrent requests can both pass it.
"""

from __future__ import annotations

import os
import sys

from modelforge_local_stack.local_stack import LocalOptions
from modelforge_local_stack.local_up import serve

if __name__ == "__main__":
    sys.setswitchinterval(float(os.environ.get("RACE_SWITCH_INTERVAL", "0.000001")))
    port = int(sys.argv[1])
    sys.exit(serve(LocalOptions(port=port, serialize_emulator=False, sweep_interval_seconds=3600)))
