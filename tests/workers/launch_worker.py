"""One launch of a one-process experiment (``tests/integration/test_runs.py``).

``launch_worker.py EXPERIMENT FIRST LAST TAG``: steps FIRST..LAST, each with ``loss = 10 *
step + TAG`` (a value that says which launch wrote it), one sample row naming the launch and
the step, and at the last step a NaN ``grad_norm`` (a non-finite anomaly). Where it resumes
from, and which run it is, the environment says (``RANKSCOPE_RESUME``, ``SLURM_*``).
"""

from __future__ import annotations

import sys

import rankscope as rs


def main(experiment: str, first: int, last: int, tag: int) -> None:
    rs.init(experiment=experiment, export_interval=0.2)
    for step in range(first, last + 1):
        rs.record_metric("loss", 10.0 * step + tag)
        rs.record_sample("launches", {"tag": tag, "step": step, "text": f"launch {tag} step {step}"})
        if step == last:
            rs.record_metric("grad_norm", float("nan"), rs.Reduce.MAX)
        rs.flush(step)
    print(f"run {rs.get_resource().attributes['rankscope.run.id']}", flush=True)  # type: ignore[union-attr]
    rs.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
