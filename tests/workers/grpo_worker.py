"""TRL's GRPOTrainer of ``examples/trl_grpo.py`` (tiny model and tokenizer, no downloads), instrumented.

Run under torchrun (2 processes, gloo, CPU). argv: steps, a directory. Each process writes
``report-<rank>.json`` there: its rank, the trainer's log history and the rows it offered to the
completions table (with the step they were offered in).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import rankscope as rs
import rankscope.trl
from rankscope.metrics import recorder as recorder_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from trl_grpo import make_trainer  # the example's trainer, as the docs show it

offered: list[dict[str, object]] = []
_sample = recorder_module.Recorder.sample


def keep(self: object, table: str, row: object, rank_by: str | None, k: int) -> None:
    """Every row offered to the table, as offered (the test checks the sink's selection against them)."""
    offered.append({"table": table, "step": rs.current_step(), **dict(row)})  # type: ignore[call-overload]
    _sample(self, table, row, rank_by, k)  # type: ignore[arg-type]


recorder_module.Recorder.sample = keep  # type: ignore[method-assign]

with tempfile.TemporaryDirectory() as out:
    trainer = make_trainer(int(sys.argv[1]), out)
    rankscope.trl.instrument(trainer, k=2)
    trainer.train()
rank = trainer.accelerator.process_index
rs.shutdown()
report = {"rank": rank, "history": trainer.state.log_history, "offered": offered}
(Path(sys.argv[2]) / f"report-{rank}.json").write_text(json.dumps(report))
