"""thrust-remote's trainer: batched torch envs, PPO, ONNX export. Entry: `python -m trainer.train`."""
