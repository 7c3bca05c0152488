"""One process of a multi-process FSDP2 test (``tests/training/test_sharding.py``), started by
``python -m dlmrl.training.cpu_launch --nproc_per_node W ... tests/training/fsdp2_worker.py JOBS.json``.

Runs the jobs of ``JOBS.json`` one after the other in the same process group (one launch pays the start-up once):
each job is ``{"overrides": [...], "crash_step": int | null, "resume": bool}``: ``dlmrl.training.trainer.train`` on
``default_job_config(overrides)``; with ``crash_step`` the run stops at the start of that step (the data loader
raises in every process, as ``tests.helpers.crash_then_resume`` does) and is resumed; with ``resume`` the job
only resumes an existing run. After each job every process writes ``<output_dir>/bytes_<rank>.json``: the
parameter and optimizer-state bytes it holds (:func:`dlmrl.training.sharding.local_bytes`), the whole model's and
the trained parameters' (a LoRA adapter's), and one dim-0 row of each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import accelerate
import torch.distributed as dist

import dlmrl.training.trainer as trainer_module
from dlmrl.config import default_job_config
from dlmrl.data.tasks import SudokuTask
from dlmrl.training import run_setup
from dlmrl.training.sharding import local_bytes


def main(jobs_file: str) -> None:
    # (the jobs share one process group: accelerate's end_training would destroy it after the first)
    accelerate.Accelerator.end_training = lambda self: None
    accelerate.PartialState(cpu=True)  # (the process group, as the trainer's Accelerator sets it up on CPU)
    runs = []
    set_up_run = trainer_module.set_up_run

    def capture(*args, **kwargs):
        run = set_up_run(*args, **kwargs)
        runs.append(run)
        return run

    trainer_module.set_up_run = capture
    # (a fresh launch's processes meet in init_process_group after checking the run folder, before the main process
    # writes config.yaml into it; sharing one process group, the jobs meet here instead)
    check_run_folder = run_setup.check_run_folder

    def checked(*args, **kwargs):
        found = check_run_folder(*args, **kwargs)
        dist.barrier()
        return found

    run_setup.check_run_folder = checked
    original = SudokuTask.train_batch
    for job in json.loads(Path(jobs_file).read_text()):
        cfg = default_job_config(job["overrides"])
        crash = job.get("crash_step")
        if crash is not None:
            def crashing(self, n, seed, step, crash=crash):
                if step == crash:
                    raise RuntimeError("simulated crash")
                return original(self, n, seed, step)

            SudokuTask.train_batch = crashing
            try:
                trainer_module.train(cfg, progress=False)
                raise AssertionError("the simulated crash did not happen")
            except RuntimeError as e:
                if "simulated crash" not in str(e):
                    raise
            SudokuTask.train_batch = original
            cfg = default_job_config(job["overrides"])
        trainer_module.train(cfg, resume=crash is not None or bool(job.get("resume")), progress=False)
        run = runs[-1]
        params, states = local_bytes(run.policy.model, run.optimizer)
        model = run.policy.model
        whole = sum(p.numel() * p.element_size() for p in model.parameters())
        rows = sum(p.shape[1:].numel() * p.element_size() for p in model.parameters())
        trained = [p for p in model.parameters() if p.requires_grad]
        (Path(cfg.output_dir) / f"bytes_{dist.get_rank()}.json").write_text(json.dumps(
            {"params": params, "optimizer": states, "whole_params": whole, "row_bytes": rows,
             "whole_trained": sum(p.numel() * p.element_size() for p in trained),
             "trained_row_bytes": sum(p.shape[1:].numel() * p.element_size() for p in trained),
             "world": dist.get_world_size()}))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
