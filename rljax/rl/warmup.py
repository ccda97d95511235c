"""The optional SFT warm-up before RL (the quickstart's first phase).

It runs the supervised trainer (`rljax.train.loop.train`) in `<run_dir>/warmup_sft`,
exports the result to `<run_dir>/warmup_sft/hf`, and returns the RL config pointed at
that export. A resumed run finds the export and skips the phase. The phase trains on
every device (`cfg.mesh` over all of them), whatever mesh the caller is under (an
asynchronous `trainer.mode` trains RL on a share of the devices).
"""

from __future__ import annotations

import dataclasses
import os

import jax

from rljax.data.config import DataConfig
from rljax.parallel import make_mesh
from rljax.rl.config import RLConfig
from rljax.train.export import export_checkpoint
from rljax.train.loop import train
from rljax.train.optim import OptimConfig
from rljax.train.run_config import RunConfig, TrainerConfig


def run_warmup_sft(cfg: RLConfig, run_dir: str) -> RLConfig:
    w = cfg.warmup_sft
    export_dir = os.path.join(run_dir, "warmup_sft", "hf")
    if not os.path.exists(os.path.join(export_dir, "config.json")):
        sft = RunConfig(
            model=cfg.model,
            data=DataConfig(format="sft", train_files=list(w.train_files),
                            max_length=cfg.row_length,
                            bucket_size=cfg.data.bucket_size, batch_size=w.batch_size, seed=cfg.data.seed),
            optim=OptimConfig(lr=w.lr, weight_decay=0.0, lr_scheduler_type="cosine", warmup_steps=min(10, w.steps // 10),
                              min_lr_ratio=0.1),
            trainer=TrainerConfig(algorithm="sft", total_steps=w.steps, default_local_dir=run_dir,
                                  experiment_name="warmup_sft", logger=cfg.trainer.logger, async_save=False),
            mesh=cfg.mesh,
        )
        with jax.set_mesh(make_mesh(cfg.mesh)):
            train(sft)
            export_checkpoint(os.path.join(run_dir, "warmup_sft"), export_dir)
    model = dataclasses.replace(cfg.model, path=export_dir, tokenizer=export_dir, hf_config={})
    return dataclasses.replace(cfg, model=model, warmup_sft=dataclasses.replace(w, enable=False))
