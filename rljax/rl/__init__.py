"""RL post-training: PPO, GRPO and relatives (config, rollouts -> batch, objectives, trainer)."""
