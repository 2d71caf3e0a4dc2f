"""A llmkiln Dynamo worker whose scheduler thread raises once a trigger file exists (fault tests only).

Run as `python tests/dynamo/faulty_worker.py ARGS...` (the launcher's worker command in tests). The trigger is
$LLMKILN_TEST_FAULT_DIR/fault-<status port>, so a test can break one chosen worker of a launch. Every step also
sleeps $LLMKILN_TEST_STEP_DELAY_S (default 0.005 s): a long request then streams for seconds, not the ~0.2 s the
tiny model needs, so a test acts on it while it runs whatever the machine's load.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dynamo.common.backend.run import run

from llmkiln.dynamo.worker import KilnWorker
from llmkiln.runtime.engine import LLMEngine


class FaultyWorker(KilnWorker):
    async def start(self, worker_id: int):
        config = await super().start(worker_id)
        trigger = Path(os.environ["LLMKILN_TEST_FAULT_DIR"]) / f"fault-{os.environ['DYN_SYSTEM_PORT']}"
        assert self.host is not None
        engine = self.host.engine
        assert isinstance(engine, LLMEngine)
        real = engine.scheduler.schedule

        delay = float(os.environ.get("LLMKILN_TEST_STEP_DELAY_S", "0.005"))

        def schedule(*args, **kwargs):  # the scheduler's own signature, passed through
            if trigger.exists():
                raise RuntimeError("injected scheduler fault")
            time.sleep(delay)
            return real(*args, **kwargs)

        engine.scheduler.schedule = schedule  # type: ignore[method-assign]  # the injected fault
        return config


if __name__ == "__main__":
    run(FaultyWorker)
